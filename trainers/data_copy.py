"""Whether the preprocessed data a trainer reads is the copy its `recpipe preprocess` run wrote, whole.
No TensorFlow here: a Horovod launcher checks its host's copy before it starts the ranks."""
from __future__ import annotations

from recpipe.common.errors import RecpipeError
from recpipe.features.preprocessed import PreprocessedData

__all__ = ["DataError", "check_whole_copy"]


class DataError(RecpipeError, ValueError):
    pass


def check_whole_copy(data: PreprocessedData) -> None:
    """Check that the shards are the ones `recpipe preprocess` wrote, by name and size (the row counts' list;
    one listing per split, no shard opened): otherwise a partial copy of the folder (a shard missing, one cut
    short at a record's end) would be read as fewer rows, and an older run's shards left beside this run's (a
    copy over an old folder) as rows numbered by another vocabulary, without a word.

    Args:
        data: the preprocessed data folder to check.

    Raises:
        DataError: the shards differ from those the run recorded; the message names the differences.
    """
    differences = data.copy_differences()
    if differences:
        raise DataError(f"{data.root} holds other shards than its preprocess run wrote: {'; '.join(differences)} "
                        f"(a copy cut short or still going on, or an older run's shards left beside this one's?); "
                        f"copy the whole folder again, into an empty one")
