"""TRACE environments as a verifiers taskset (``vf-eval verifiers_trace``); see the README."""

from verifiers_trace.taskset import (
    TraceData,
    TraceEnv,
    TraceEnvConfig,
    TraceState,
    TraceTask,
    TraceTaskset,
    TraceTasksetConfig,
    load_environment,
)

# verifiers' loader takes the one Taskset and the one Env subclass listed here.
__all__ = ["TraceData", "TraceEnv", "TraceEnvConfig", "TraceState", "TraceTask", "TraceTaskset",
           "TraceTasksetConfig", "load_environment"]
