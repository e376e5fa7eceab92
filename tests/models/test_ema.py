import torch

from marlhf.models.ema import EMA


def test_ema_matches_hand_recursion():
    m = torch.nn.Linear(2, 2)
    with torch.no_grad():
        m.weight.fill_(1.0)
        m.bias.fill_(0.0)
    ema = EMA(m, decay=0.9)
    expected = 1.0
    for value in (2.0, 4.0, -1.0):
        with torch.no_grad():
            m.weight.fill_(value)
        ema.update(m)
        expected = 0.9 * expected + 0.1 * value
    assert torch.allclose(ema.shadow["weight"], torch.full((2, 2), expected))
    sd = ema.state_dict(like={k: v.half() for k, v in m.state_dict().items()})
    assert sd["weight"].dtype == torch.float16
