"""pallas-evolve: mlflow_runs — lineage in MLflow (best-effort) and the champion registry."""

from ._champion import ALIAS, call_spec, champion_header, example_inputs, register_champion, with_docstring
from ._lineage_svg import lineage_svg
from ._notes import run_link
from ._store import DEFAULT_DATA_DIR, ensure_store, tracking_uri_for
from ._tracker import Tracker, individual_run, row_key
from ._tree import family_tree_svg

__all__ = ["ALIAS", "DEFAULT_DATA_DIR", "Tracker", "call_spec", "champion_header", "example_inputs", "ensure_store",
           "family_tree_svg",
           "individual_run", "lineage_svg", "register_champion", "row_key", "run_link", "tracking_uri_for",
           "with_docstring"]
