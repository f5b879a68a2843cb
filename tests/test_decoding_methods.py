"""Which checkpoint objective serves which decoding method."""

import pytest

from cardjax.decoding.methods import METHODS, SERVES, check_method
from cardjax.errors import CardjaxError


def test_each_objective_serves_its_family():
  check_method("mars", "mars")
  check_method("card", "card")
  check_method("dus", "mdlm")
  check_method("dus", "card")
  check_method("ar", None)  # an imported HF model is a causal LM
  assert set(SERVES[None]) == set(METHODS)


@pytest.mark.parametrize("method,objective,fits", [
    ("mars", "card", "ar, card, dus, eb, cb"), ("ar", "mdlm", "dus, eb, cb"),
    ("card", "mars", "ar, mars"), ("dus", "bd3lm", "none of cardjax's decoders yet")])
def test_a_mismatch_names_the_methods_that_fit(method, objective, fits):
  with pytest.raises(CardjaxError, match=f"cannot serve --method {method}; methods that fit: "
                                         f"{fits}"):
    check_method(method, objective)


def test_unknown_method_or_objective():
  with pytest.raises(CardjaxError, match="unknown decoding method 'beam'"):
    check_method("beam", "ar")
  with pytest.raises(CardjaxError, match="objective 'gpt'"):
    check_method("ar", "gpt")
