"""A BM25 search tool over a local document collection (a small, offline stand-in for the legacy
``vwxyzjn/pyserini-wikipedia-kilt-doc`` Wikipedia tool)."""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Sequence, Union

from textenv.extras import require

Documents = Union[str, os.PathLike, Sequence[Union[str, dict]]]
_TEXT_SUFFIXES = (".txt", ".md")
_PARAGRAPH_BREAK = re.compile(r"\n\s*\n")
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+")


@dataclass(frozen=True)
class Passage:
    """One searchable piece of a document: the document's title and up to ``passage_chars`` of its text."""

    title: str
    text: str


class WikiSearch:
    """Search a document collection with BM25 (the ``bm25s`` library) and return the best passage(s).

    Documents are split into passages of about ``passage_chars`` characters (at paragraph, then sentence,
    then word boundaries); each passage is indexed with its document's title. A result is
    ``"<title>\\n<passage text>"`` — the passage text is on one line, so the legacy TRL recipe
    ``wiki(query).split("\\n")[1]`` still gives the passage. With ``top_k > 1`` results are separated
    by a blank line. An empty query or a query sharing no word with the collection returns an
    explanatory text instead of a passage.

    Args:
        documents (`str`, `os.PathLike` or `list`):
            A folder (every ``.txt``/``.md`` file below it, sorted by path; the title is the file name
            without suffix, or a leading Markdown ``# heading``), a ``.jsonl`` file (one
            ``{"title": ..., "text": ...}`` or ``{"text": ...}`` object per line), a single
            ``.txt``/``.md`` file, or a list of strings and/or ``{"title", "text"}`` dicts.
        top_k (`int`, *optional*, defaults to 1):
            Passages returned per query.
        max_chars (`int`, *optional*, defaults to 1000):
            Longest text returned per passage (the title line not counted); longer text ends in ``...``.
        passage_chars (`int`, *optional*, defaults to 600):
            Target passage size when splitting documents.
        stopwords (`str` or `list`, *optional*, defaults to `"en"`):
            Stopwords removed before indexing, as understood by ``bm25s`` (``None`` keeps every word).
        stemming (`bool`, *optional*, defaults to `True`):
            Stem words with PyStemmer's English stemmer when the ``PyStemmer`` package is installed;
            without it words are matched exactly (lower-cased).

    Example:

    ```python
    >>> search = WikiSearch([{"title": "Paris", "text": "Paris is the capital of France."},
    ...                      {"title": "Berlin", "text": "Berlin is the capital of Germany."}])
    >>> search("capital of Germany")
    'Berlin\\nBerlin is the capital of Germany.'
    ```
    """

    # Constructor arguments that name files; load_tool resolves them inside the tool repository.
    file_arguments = ("documents",)

    def __init__(
        self,
        documents: Documents,
        top_k: int = 1,
        max_chars: int = 1000,
        passage_chars: int = 600,
        stopwords: str | list[str] | None = "en",
        stemming: bool = True,
    ):
        if top_k < 1:
            raise ValueError(f"top_k must be at least 1, got {top_k}.")
        self.top_k = top_k
        self.max_chars = max_chars
        self.passage_chars = passage_chars
        self.stopwords = stopwords
        self.stemming = stemming
        self.documents: list[dict[str, str]] = read_documents(documents)
        self.passages: list[Passage] = [
            passage for document in self.documents for passage in split_document(document, passage_chars)
        ]
        if not self.passages:
            raise ValueError("WikiSearch: the document collection has no text to search.")
        self._tokenizer, self._retriever = self._build_index()

    def __call__(self, query: str) -> str:
        """Return the best passage(s) for ``query`` as text."""
        if not isinstance(query, str) or not query.strip():
            return "Empty query: write the words to search for."
        found = self.search(query)
        if not found:
            return f"No passage matches {query.strip()!r}."
        return "\n\n".join(self._show(passage) for passage, _ in found)

    def search(self, query: str, top_k: int | None = None) -> list[tuple[Passage, float]]:
        """The best passages for ``query`` with their BM25 scores, best first; passages that share no
        word with the query are left out."""
        query_ids = self._tokenizer.tokenize([query], update_vocab=False, return_as="ids", show_progress=False)
        if not any(query_ids[0]):  # every word unknown (id 0) or a stopword
            return []
        k = min(top_k or self.top_k, len(self.passages))
        indices, scores = self._retriever.retrieve(query_ids, k=k, show_progress=False)
        return [
            (self.passages[int(index)], float(score))
            for index, score in zip(indices[0], scores[0])
            if score > 0
        ]

    def save_files(self, folder: str | os.PathLike) -> dict[str, str]:
        """Write the documents to ``documents.jsonl`` in ``folder`` (used by :func:`~textenv.tools.save_tool`)
        and return the constructor argument that points to it."""
        path = Path(folder) / "documents.jsonl"
        with path.open("w", encoding="utf-8") as jsonl:
            for document in self.documents:
                jsonl.write(json.dumps(document, ensure_ascii=False) + "\n")
        return {"documents": path.name}

    def _build_index(self):
        bm25s = require("bm25s", "WikiSearch")
        from bm25s.tokenization import Tokenizer

        tokenizer = Tokenizer(stopwords=self.stopwords or [], stemmer=_english_stemmer() if self.stemming else None)
        texts = [f"{passage.title}\n{passage.text}" for passage in self.passages]
        corpus_ids = tokenizer.tokenize(texts, update_vocab=True, return_as="ids", show_progress=False)
        retriever = bm25s.BM25()
        retriever.index(corpus_ids, show_progress=False)
        return tokenizer, retriever

    def _show(self, passage: Passage) -> str:
        text = passage.text
        if len(text) > self.max_chars:
            text = text[: max(self.max_chars - 3, 0)].rstrip() + "..."
        return f"{passage.title}\n{text}" if passage.title else text


def read_documents(documents: Documents) -> list[dict[str, str]]:
    """Normalise ``documents`` (a folder, a ``.jsonl`` file, a text file or a list) to a list of
    ``{"title": str, "text": str}`` dicts."""
    if isinstance(documents, (str, os.PathLike)):
        return _read_path(Path(documents))
    if isinstance(documents, Iterable):
        return [_as_document(item, position) for position, item in enumerate(documents)]
    raise TypeError(f"documents must be a path or a list of texts/dicts, got {type(documents).__name__}.")


def _read_path(path: Path) -> list[dict[str, str]]:
    if path.is_dir():
        files = sorted(p for p in path.rglob("*") if p.is_file() and p.suffix.lower() in _TEXT_SUFFIXES)
        return [_read_text_file(file) for file in files]
    if path.is_file() and path.suffix.lower() == ".jsonl":
        return _read_jsonl(path)
    if path.is_file() and path.suffix.lower() in _TEXT_SUFFIXES:
        return [_read_text_file(path)]
    if path.exists():
        raise ValueError(f"documents: {path} is neither a folder, a .jsonl file nor a .txt/.md file.")
    raise FileNotFoundError(f"documents: no such file or folder: {path}")


def _read_text_file(path: Path) -> dict[str, str]:
    text = path.read_text(encoding="utf-8", errors="replace")
    heading = re.match(r"\s*#\s+(.+?)\s*\n", text) if path.suffix.lower() == ".md" else None
    if heading:
        return {"title": heading.group(1), "text": text[heading.end() :]}
    return {"title": path.stem, "text": text}


def _read_jsonl(path: Path) -> list[dict[str, str]]:
    documents = []
    with path.open(encoding="utf-8") as lines:
        for number, line in enumerate(lines, start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as error:
                raise ValueError(f"{path}, line {number}: not valid JSON ({error.msg}).") from None
            documents.append(_as_document(record, number, where=f"{path}, line {number}"))
    return documents


def _as_document(item: Any, position: int, where: str | None = None) -> dict[str, str]:
    where = where or f"documents[{position}]"
    if isinstance(item, str):
        return {"title": "", "text": item}
    if isinstance(item, dict) and isinstance(item.get("text"), str):
        return {"title": str(item.get("title") or ""), "text": item["text"]}
    raise ValueError(f"{where}: expected a string or a dict with a 'text' string, got {item!r:.80}.")


def split_document(document: dict[str, str], passage_chars: int) -> list[Passage]:
    """Split a document into passages of at most about ``passage_chars`` characters, each on one line."""
    pieces = []
    for paragraph in _PARAGRAPH_BREAK.split(document["text"]):
        flat = " ".join(paragraph.split())
        if flat:
            pieces.extend(_split_long(flat, passage_chars))
    return [Passage(document["title"], text) for text in _pack(pieces, passage_chars)]


def _split_long(text: str, limit: int) -> list[str]:
    if len(text) <= limit:
        return [text]
    sentences = _SENTENCE_END.split(text)
    if len(sentences) > 1:
        return [piece for sentence in sentences for piece in _split_long(sentence, limit)]
    words, chunks, current = text.split(" "), [], ""
    for word in words:
        if current and len(current) + 1 + len(word) > limit:
            chunks.append(current)
            current = word
        else:
            current = f"{current} {word}" if current else word
    return chunks + [current] if current else chunks


def _pack(pieces: list[str], limit: int) -> list[str]:
    # Join consecutive small pieces so passages are neither tiny fragments nor over the limit.
    packed: list[str] = []
    for piece in pieces:
        if packed and len(packed[-1]) + 1 + len(piece) <= limit:
            packed[-1] = f"{packed[-1]} {piece}"
        else:
            packed.append(piece)
    return packed


def _english_stemmer():
    try:
        import Stemmer
    except ImportError:
        return None
    return Stemmer.Stemmer("english")  # bm25s calls its stemWord on each word
