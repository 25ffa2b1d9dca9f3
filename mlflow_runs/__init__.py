"""pallas-evolve: mlflow_runs — lineage in MLflow (best-effort) and the champion registry."""

from ._champion import ALIAS, register_champion
from ._lineage_svg import lineage_svg
from ._store import DEFAULT_DATA_DIR, ensure_store, tracking_uri_for
from ._tracker import Tracker, row_key
from ._tree import family_tree_svg

__all__ = ["ALIAS", "DEFAULT_DATA_DIR", "Tracker", "ensure_store", "family_tree_svg", "lineage_svg",
           "register_champion", "row_key", "tracking_uri_for"]
