"""pallas-evolve: archive — every evaluation as append-only Parquet, plus the records ``resume`` needs."""

from ._archive import DEFAULT_DATA_DIR, Archive
from ._errors import ArchiveError
from ._identity import individual_id, normalize_source
from ._schema import COLUMNS, SCHEMA, edit_label, make_row, normalize_row, row_to_result_dict

__all__ = [
           "COLUMNS",
           "DEFAULT_DATA_DIR",
           "SCHEMA",
           "edit_label",
           "Archive",
           "ArchiveError",
           "individual_id",
           "make_row",
           "normalize_row",
           "normalize_source",
           "row_to_result_dict",
]
