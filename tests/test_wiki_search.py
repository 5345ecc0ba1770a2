import json

import pytest

from textenv.tools import WikiSearch, call_tool
from textenv.tools.wiki_search import read_documents, split_document

ARTICLES = [
    {
        "title": "Patricia Neary",
        "text": "Patricia Neary is an American ballerina, choreographer and ballet director. "
        "She has been particularly active in Switzerland and staged ballets of George Balanchine.",
    },
    {
        "title": "Super Bowl XX",
        "text": "Super Bowl XX was an American football game. The Chicago Bears defeated the "
        "New England Patriots 46 to 10 to win their first Super Bowl.",
    },
    {
        "title": "Python (programming language)",
        "text": "Python is a high-level programming language. Guido van Rossum began working on "
        "Python in the late 1980s as a successor to the ABC language.",
    },
]


@pytest.fixture()
def folder(tmp_path):
    root = tmp_path / "wiki"
    (root / "sport").mkdir(parents=True)
    (root / "Patricia Neary.txt").write_text(ARTICLES[0]["text"])
    (root / "sport" / "superbowl.md").write_text(f"# Super Bowl XX\n\n{ARTICLES[1]['text']}\n")
    (root / "Python.txt").write_text(ARTICLES[2]["text"])
    (root / "ignored.csv").write_text("Chicago,Bears,Chicago,Bears")
    return root


@pytest.fixture()
def jsonl(tmp_path):
    path = tmp_path / "wiki.jsonl"
    lines = [json.dumps(article) for article in ARTICLES[:2]] + ["", json.dumps({"text": ARTICLES[2]["text"]})]
    path.write_text("\n".join(lines) + "\n")
    return path


def test_list_of_dicts_ranks_the_right_passage_first():
    search = WikiSearch(ARTICLES)
    assert search("Who won Super Bowl XX?") == f"Super Bowl XX\n{ARTICLES[1]['text']}"
    assert search("Which ballet company did Patricia Neary work for?").startswith("Patricia Neary\n")
    assert search("who created the Python language").startswith("Python (programming language)\n")


def test_list_of_strings_has_no_title_line():
    search = WikiSearch([article["text"] for article in ARTICLES])
    assert search("Chicago Bears") == ARTICLES[1]["text"]


def test_folder_of_text_and_markdown_files(folder):
    search = WikiSearch(folder)
    assert [document["title"] for document in search.documents] == ["Patricia Neary", "Python", "Super Bowl XX"]
    assert search("Chicago Bears Patriots").startswith("Super Bowl XX\nSuper Bowl XX was")
    assert search("Guido van Rossum").startswith("Python\n")


def test_jsonl_file(jsonl):
    search = WikiSearch(jsonl)
    assert [document["title"] for document in search.documents] == ["Patricia Neary", "Super Bowl XX", ""]
    assert search("Balanchine choreographer").startswith("Patricia Neary\n")
    assert search("Guido van Rossum") == ARTICLES[2]["text"]


def test_legacy_recipe_second_line_is_the_passage():
    # legacy TRL triviaqa: {"Wiki": lambda q: wiki(q).split("\n")[1][:600]}
    wiki = WikiSearch([{"title": "A", "text": "line one\nline two\n\nnew paragraph about zebras"}])
    assert wiki("zebras").split("\n")[1] == "line one line two new paragraph about zebras"


def test_top_k_returns_several_passages_best_first():
    search = WikiSearch(ARTICLES, top_k=2)
    found = search.search("American football ballet")
    assert len(found) == 2
    assert found[0][1] >= found[1][1] > 0
    assert search("American football ballet").count("\n\n") == 1


def test_empty_query_and_no_match_are_text():
    search = WikiSearch(ARTICLES)
    assert search("") == "Empty query: write the words to search for."
    assert search("   ") == "Empty query: write the words to search for."
    assert search("xylophone zeppelin") == "No passage matches 'xylophone zeppelin'."
    assert search("the of and") == "No passage matches 'the of and'."  # stopwords only
    assert search.search("xylophone") == []


def test_long_documents_are_split_into_passages_and_results_capped():
    filler = " ".join(f"Sentence number {n} talks about weather." for n in range(60))
    document = {"title": "Long", "text": filler + "\n\nThe secret ingredient is saffron. " + filler}
    passages = split_document(document, passage_chars=200)
    assert len(passages) > 5
    assert all(len(passage.text) <= 200 for passage in passages)
    search = WikiSearch([document], passage_chars=200, max_chars=50)
    result = search("secret ingredient saffron")
    assert "The secret ingredient is saffron." in WikiSearch([document], passage_chars=200)("saffron")
    assert result.startswith("Long\n")
    assert len(result.split("\n")[1]) <= 50
    assert result.endswith("...")


def test_bad_inputs_raise_clear_errors(tmp_path):
    with pytest.raises(FileNotFoundError):
        WikiSearch(tmp_path / "missing")
    with pytest.raises(ValueError, match="no text"):
        WikiSearch(["", "   "])
    with pytest.raises(ValueError, match="documents\\[1\\]"):
        read_documents(["fine", {"title": "no text"}])
    broken = tmp_path / "broken.jsonl"
    broken.write_text('{"text": "ok"}\nnot json\n')
    with pytest.raises(ValueError, match="line 2"):
        WikiSearch(broken)
    with pytest.raises(ValueError, match="top_k"):
        WikiSearch(ARTICLES, top_k=0)


def test_works_through_the_tool_protocol():
    assert call_tool(WikiSearch(ARTICLES), "Chicago Bears").startswith("Super Bowl XX\n")
