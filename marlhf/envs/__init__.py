"""Environments of multi-turn agents: skyrl-gym's ``BaseTextEnv`` interface, so an environment
written for SkyRL runs here unchanged.

- ``config``: the flags (``--env``, ``--env_config``, ``--max_turns``, ``--max_total_seq_len``,
  ``--env_timeout_s``, ``--env_workers``, ``--env_errors``);
- ``loading``: the environment class of ``--env`` (a registered id, ``file.py:Class`` or
  ``module:Class``), ``--env_config``, the bundled ids;
- ``tools``: skyrl-gym's Python tool through the project's sandbox;
- ``worker``: where the environments live (this process, or a process per row with timeouts);
- ``runner``: the episodes of a batch of rows, given a policy ``act``;
- ``trail``: the bundled task's environment (:mod:`marlhf.data.trail` is its world and gold).
"""
