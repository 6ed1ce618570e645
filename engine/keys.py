"""Model keys: the OS keyring, the environment variable each provider reads, and the checks
(`keepstep keys check`, the model findings of a project).

A public namespace of ``keepstep.engine`` (``from keepstep.engine import keys``): each name is
loaded on first use, so importing the namespace costs nothing.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from keepstep.engine._lazy import lazy_exports

if TYPE_CHECKING:
    from keepstep.engine.gateway.keys import (
        delete_api_key,
        env_var_name,
        key_source,
        require_keyring,
        set_api_key,
    )
    from keepstep.engine.gateway.model_check import (
        KeyCheck,
        KeyStatus,
        ModelFinding,
        check_key,
        key_statuses,
        model_findings,
    )

_EXPORTS: dict[str, str] = {
    "delete_api_key": "keepstep.engine.gateway.keys",
    "env_var_name": "keepstep.engine.gateway.keys",
    "key_source": "keepstep.engine.gateway.keys",
    "require_keyring": "keepstep.engine.gateway.keys",
    "set_api_key": "keepstep.engine.gateway.keys",
    "KeyCheck": "keepstep.engine.gateway.model_check",
    "KeyStatus": "keepstep.engine.gateway.model_check",
    "ModelFinding": "keepstep.engine.gateway.model_check",
    "check_key": "keepstep.engine.gateway.model_check",
    "key_statuses": "keepstep.engine.gateway.model_check",
    "model_findings": "keepstep.engine.gateway.model_check",
}
__all__ = [
    "KeyCheck",
    "KeyStatus",
    "ModelFinding",
    "check_key",
    "delete_api_key",
    "env_var_name",
    "key_source",
    "key_statuses",
    "model_findings",
    "require_keyring",
    "set_api_key",
]
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
