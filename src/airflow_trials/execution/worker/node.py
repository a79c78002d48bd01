"""Which Ray node a trial actor runs on, for its results' ``node_ip`` and ``node_id`` fields."""

from __future__ import annotations


def node_ip() -> str:
    """The IP address of the Ray node this process runs on (127.0.0.1 outside Ray)."""
    try:
        import ray

        if ray.is_initialized():
            return str(ray.util.get_node_ip_address())
    except Exception:  # noqa: BLE001 - the node ip is informational only
        pass
    return "127.0.0.1"


def node_id() -> str | None:
    """The hex id of the Ray node this actor runs on (None outside Ray)."""
    try:
        import ray

        if ray.is_initialized():
            return str(ray.get_runtime_context().get_node_id())
    except Exception:  # noqa: BLE001 - the node id is informational only
        pass
    return None
