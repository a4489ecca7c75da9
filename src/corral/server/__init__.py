"""The control plane: FastAPI app, auth, scheduler loop."""

from corral.server.app import create_app
from corral.server.main import DEFAULT_DATA_DIR, open_store, serve

__all__ = ["DEFAULT_DATA_DIR", "create_app", "open_store", "serve"]
