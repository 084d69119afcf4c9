"""Transport and platform plugins: every plugin's probe result and reason (TransferEngine.plugins()).

The requested --protocol must be served by a transport in state "loaded"; otherwise the engine's
initialize() fails with that plugin's reason. Loading the plugins opens no device the probe does not need.
"""

from __future__ import annotations

from .report import FAIL, INFO, OK, Config, Finding, Host  # noqa: F401  (Host: the check signature)


def plugin_states() -> list[dict] | str:
    """TransferEngine.plugins(), or the reason it cannot be asked (native module missing)."""
    try:
        from mooncake.engine import TransferEngine
    except ImportError as e:
        return f"mooncake.engine does not import: {e}"
    return TransferEngine.plugins()


def check(host: Host, cfg: Config, states=None) -> list[Finding]:
    states = plugin_states() if states is None else states
    if isinstance(states, str):
        return [Finding("plugins", "engine", FAIL, states, "install the mooncake wheel for this Python")]
    findings = []
    for p in states:
        loaded = p["state"] == "loaded"
        protos = ",".join(p["protocols"]) or "-"
        detail = ("ready" if loaded else p["state"] + ": " + (p["reason"] or "no reason given"))
        origin = "" if p["origin"] == "builtin" else f" [{p['origin']}]"
        findings.append(Finding("plugins", f"{p['kind']} {p['name']} ({protos})", OK if loaded else INFO,
                                detail + origin, data=p))
    serving = [p for p in states if p["kind"] == "transport" and cfg.protocol in p["protocols"]]
    if any(p["state"] == "loaded" for p in serving):
        findings.append(Finding("plugins", f"protocol {cfg.protocol}", OK, "a loaded transport serves it"))
    elif serving:
        reasons = "; ".join(f"{p['name']}: {p['reason'] or p['state']}" for p in serving)
        findings.append(Finding("plugins", f"protocol {cfg.protocol}", FAIL, f"no usable transport ({reasons})",
                                "fix what the reason says, or use --protocol tcp"))
    else:
        findings.append(Finding("plugins", f"protocol {cfg.protocol}", FAIL, "no installed transport plugin "
                                "serves it", "install the wheel variant with that transport, or set "
                                "MC_PLUGIN_DIR to where its libmc_transport_*.so is; or use --protocol tcp"))
    return findings


def ready_transports(states) -> list[str]:
    if isinstance(states, str):
        return []
    return [p["name"] for p in states if p["kind"] == "transport" and p["state"] == "loaded"]

