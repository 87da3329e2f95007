"""SWE-smith-style repository repair tasks (docs/design.md, "Target environments").

Modules, in pipeline order:

* :mod:`.repos` — repositories (PyPI sdists, local git repositories, directories) and how to test them;
* :mod:`.mutations` — procedural bugs on libcst (SWE-smith's modifier families);
* :mod:`.images` and :mod:`.sandbox` — the Docker image per repository and the locked-down container
  per episode (``DockerSandbox``), or ``LocalSandbox`` where Docker is missing; inside the sandbox,
  :mod:`.sandbox_pytest` (a pytest launcher the repository cannot shadow), :mod:`.sandbox_tree` (the
  grader's restore of tests and configuration) and :mod:`.pytest_report` (explicit per-test statuses);
* :mod:`.tasks` — validation (FAIL_TO_PASS / PASS_TO_PASS), issue texts, the instance store, grading;
* :mod:`.envs` — ``trace/swe_repo-v0``; the capability env ``trace/swe_localization-v0`` lives in
  :mod:`trace_envs.capabilities.swe_localization`;
* :mod:`.agents` — the oracle's relatives with planted deficits;
* :mod:`.cheats` — adversarial agents that try to earn the reward without a fix (all must score 0.0).

Importing this package imports neither docker nor libcst; they load when used.
"""

from trace_envs.agents import register_agent_module

register_agent_module("trace_envs.swe.agents")
register_agent_module("trace_envs.swe.cheats")
