"""Answer extraction (GSM8K-style default, user regexes), normalisation, jsonl reading."""

import json

import pytest

from cardjax.errors import CardjaxError
from cardjax.eval import answers, jsonl


def test_default_extraction_is_gsm8k_style():
  assert answers.extract("so 3 + 4 = 7 apples\n#### 7") == "7"
  assert answers.extract("#### 5\nthen #### 12 more") == "12 more"  # the last '####'
  assert answers.extract("She has 3 bags, 1,250 apples. The answer is 1,250.") == "1,250"
  assert answers.extract("it costs -$4.50 today") == "-$4.50"
  assert answers.extract("no number here") is None


def test_user_regex_takes_the_last_match_and_its_first_group():
  pattern = answers.compile_pattern(r"answer is (\w+)")
  assert answers.extract("answer is a, no: answer is b.", pattern) == "b"
  assert answers.extract("ANSWER: yes", answers.compile_pattern(r"yes|no")) == "yes"
  assert answers.extract("nothing", pattern) is None
  with pytest.raises(CardjaxError, match=r"--extract '\(unclosed' is not a valid regular"):
    answers.compile_pattern("(unclosed")


def test_reference_and_normalisation():
  assert answers.reference("Natalia sold 48 + 24 = 72 clips.\n#### 72") == "72"
  assert answers.reference(" Paris ") == "Paris"
  assert answers.correct("The total is $1,000.", "1000", normalise=True) == (True, "$1,000")
  assert answers.correct("The total is $1,000.", "1000") == (False, "$1,000")
  assert answers.correct("#### Paris.", "paris", normalise=True)[0]
  assert answers.correct("no answer", "3") == (False, None)


def test_jsonl_lines_are_checked_with_their_number(tmp_path):
  path = tmp_path / "set.jsonl"
  good = json.dumps({"question": "1 + 1?", "answer": 2})
  path.write_text(good + "\n" + good + "\n")
  rows = jsonl.read_examples(path, "question", "answer")
  assert rows[1] == {"prompt": "1 + 1?", "answer": "2", "line": 2}  # a number as text
  assert len(jsonl.read_examples(path, "question", limit=1)) == 1
  cases = [(good + "\n\n" + good, r"set.jsonl:2 is empty"),
           (good + "\n{bad json", r"set.jsonl:2 is not valid JSON"),
           ("[1, 2]", r"set.jsonl:1 holds a JSON list, not an object"),
           (json.dumps({"q": "x", "answer": "1"}), r"set.jsonl:1 has no field 'question' "
                                                    r"\(it has \['answer', 'q'\]\)"),
           (json.dumps({"question": "", "answer": "1"}), r"field 'question' must be a "
                                                          r"non-empty string"),
           ("", r"holds no examples")]
  for text, message in cases:
    path.write_text(text)
    with pytest.raises(CardjaxError, match=message):
      jsonl.read_examples(path, "question", "answer")
  with pytest.raises(CardjaxError, match=r"--file .*missing.jsonl does not exist"):
    jsonl.read_examples(tmp_path / "missing.jsonl")
