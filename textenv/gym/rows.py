"""Dataset rows: reading them (JSONL, JSON, `datasets.Dataset`, lists of dicts) and turning one into a
`RolloutInferRequest`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Dict, Iterable, List, Mapping, Union

from textenv.gym.env import RolloutInferRequest, new_trajectory_id
from textenv.jsonl import iter_jsonl

REQUEST_COLUMNS = ("messages", "images", "audios", "videos", "tools", "objects")


def load_rows(source: Union[str, Path, Iterable[Mapping[str, Any]]]) -> List[Dict[str, Any]]:
    """The rows of a dataset.

    Args:
        source: a `.jsonl` file (one JSON object a line; blank lines skipped), a `.json` file holding a
            list, a `datasets` folder (`save_to_disk`; its `train` split if it holds several), a hub
            dataset id (its `train` split), a `datasets.Dataset`, or any iterable of dicts.

    Raises:
        FileNotFoundError: `source` names a `.json` / `.jsonl` file or a path that does not exist.
        ValueError: a line or item is not a JSON object / dict (the message gives its position).
    """
    if isinstance(source, (str, Path)):
        return _read_source(source)
    rows = []
    for index, row in enumerate(source):
        if not isinstance(row, Mapping):
            raise ValueError(f"row {index} is a {type(row).__name__}, expected a dict.")
        rows.append(dict(row))
    return rows


def _read_source(source: Union[str, Path]) -> List[Dict[str, Any]]:
    path = Path(source)
    if path.is_file():
        return _read_file(path)
    if path.is_dir():
        import datasets

        loaded = datasets.load_from_disk(str(path))
        return load_rows(loaded["train"] if isinstance(loaded, datasets.DatasetDict) else loaded)
    if isinstance(source, Path) or path.suffix in (".json", ".jsonl") or str(source).startswith((".", "/", "~")):
        raise FileNotFoundError(f"dataset {str(source)!r}: no such file or folder (give a .jsonl / .json file, a datasets folder or a hub dataset id).")
    import datasets

    return load_rows(datasets.load_dataset(str(source), split="train"))


def _read_file(path: Path) -> List[Dict[str, Any]]:
    if path.suffix == ".json":
        return load_rows(json.loads(path.read_text(encoding="utf-8")))
    return list(iter_jsonl(path))


def make_request(row: Mapping[str, Any]) -> RolloutInferRequest:
    """A fresh request for one episode of `row`: the request columns go to their fields, every other
    column (including `env_config` and `ctx_config`) to `data_dict`; a new unique `uuid`."""
    request = RolloutInferRequest(uuid=new_trajectory_id())
    for column in REQUEST_COLUMNS:
        if row.get(column) is not None:
            setattr(request, column, row[column])
    request.data_dict = {key: value for key, value in row.items() if key not in REQUEST_COLUMNS}
    return request
