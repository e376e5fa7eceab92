"""What a ``torch.save`` file refers to by name: the modules of the classes and functions its pickle
names (read from its opcodes, nothing is loaded or run)."""

from __future__ import annotations

import pickletools
import zipfile
from pathlib import Path


def pickled_modules(path: Path) -> set[str]:
    """The modules named by the GLOBAL / STACK_GLOBAL opcodes of ``path``'s pickle (torch's zip
    format, or a plain pickle)."""
    if zipfile.is_zipfile(path):
        with zipfile.ZipFile(path) as z:
            data = z.read(next(n for n in z.namelist() if n.endswith("data.pkl")))
    else:
        data = Path(path).read_bytes()
    modules, strings = set(), []
    for op, arg, _ in pickletools.genops(data):
        if op.name == "GLOBAL":
            modules.add(arg.split(" ", 1)[0])
        elif op.name == "STACK_GLOBAL":
            modules.add(strings[-2])
        if isinstance(arg, str):
            strings.append(arg)
    return modules
