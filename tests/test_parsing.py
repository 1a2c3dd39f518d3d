import pytest

from lad.core.labels import get_scheme
from lad.core.parsing import UNPARSEABLE, majority_vote, parse_answer, parse_answer_is, parse_cot

D4 = get_scheme("digits").labels(4)
D12 = get_scheme("digits").labels(12)
UP = get_scheme("upper").labels(6)
ROMAN = get_scheme("roman").labels(12)
WORDS = get_scheme("words").labels(8)


@pytest.mark.parametrize(
    ("reply", "labels", "expected"),
    [
        ("3", D4, 2),
        (" 3.\n", D4, 2),
        ("**2**", D4, 1),
        ("Image 4", D4, 3),
        ("Answer: 1", D4, 0),
        ("The answer is 2.", D4, 1),
        ("(4)", D4, 3),
        ("10", D12, 9),
        ("12", D12, 11),
        ("1", D12, 0),
        ("I pick image 11.", D12, 10),  # "11" is one number, never "1"
        ("3 or 4", D4, UNPARSEABLE),  # several labels: never silently the first
        ("Images 1 and 2 both match", D4, UNPARSEABLE),
        ("7", D4, UNPARSEABLE),  # out of range
        ("", D4, UNPARSEABLE),
        ("I cannot tell.", D4, UNPARSEABLE),
        ("C", UP, 2),
        ("Image B.", UP, 1),
        ("c", UP, UNPARSEABLE),  # letters are case-sensitive
        ("IV", ROMAN, 3),
        ("XII", ROMAN, 11),
        ("I think it is II", ROMAN, UNPARSEABLE),  # "I" and "II" both appear
        ("II", ROMAN, 1),
        ("Third", WORDS, 2),
        ("the eighth image", WORDS, 7),
        ("first or second", WORDS, UNPARSEABLE),
    ],
)
def test_parse_answer(reply, labels, expected):
    assert parse_answer(reply, labels) == expected


@pytest.mark.parametrize(
    ("reply", "expected"),
    [
        ("<think>Image 1 is red, image 3 is blue.</think> 3", 2),
        ("image 2 looks right </think>\n2", 1),
        ("<think>maybe 1</think> wait </think> 4", 3),
        ("<think>image 3 matches", UNPARSEABLE),  # never closed
        ("</think> 2 or 3", UNPARSEABLE),
    ],
)
def test_parse_cot(reply, expected):
    assert parse_cot(reply, D4) == expected


@pytest.mark.parametrize(
    ("reply", "expected"),
    [
        ("Image 1 shows a cat. Image 2 a dog. The answer is 2", 1),
        ("The answer is 10 because it shows two dogs.", 9),
        ("the answer is 3. Actually the answer is 4.", 3),
        ("Image 4 fits best.", UNPARSEABLE),  # not in the required format
    ],
)
def test_parse_answer_is(reply, expected):
    assert parse_answer_is(reply, D12) == expected


def test_majority_vote_ties_go_to_earliest_first_vote():
    assert majority_vote([2, 0, 0, 2, -1]) == 2
    assert majority_vote([0, 2, 2, 0]) == 0
    assert majority_vote([1, 3, 3]) == 3
    assert majority_vote([-1, -1]) == UNPARSEABLE
