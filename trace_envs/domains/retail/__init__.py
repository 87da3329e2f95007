"""The retail domain (τ²-bench style): generated store database, tools, policy and tasks.

``trace/tau_retail-v0`` is :class:`~trace_envs.domains.retail.env.TauRetailEnv`.
"""

from .env import RetailDomain, TauRetailEnv
from .tools import RetailTools

__all__ = ["RetailDomain", "RetailTools", "TauRetailEnv"]
