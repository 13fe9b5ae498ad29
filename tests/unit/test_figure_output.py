"""parallel_course.figure_output: a figure's PNG travels with its text alternative."""

import base64

import pytest
from matplotlib.figure import Figure

from parallel_course.figure_output import png_output


def test_png_output_holds_a_png_and_the_alt_as_metadata_and_plain_text():
    fig = Figure(figsize=(2, 1))
    fig.subplots().plot([0, 1], [1, 0])
    data, metadata = png_output(fig, "a line falling from 1 to 0")
    assert base64.b64decode(data["image/png"])[:8] == b"\x89PNG\r\n\x1a\n"
    assert data["text/plain"] == metadata["alt"] == "a line falling from 1 to 0"


def test_png_output_refuses_a_figure_without_a_text_alternative():
    with pytest.raises(ValueError, match="text alternative"):
        png_output(Figure(), "  ")


def test_a_plain_text_that_does_not_vary_can_stand_in_for_an_alt_that_does():
    data, metadata = png_output(Figure(figsize=(1, 1)), "2 cores, no GPU", plain="this machine, drawn")
    assert data["text/plain"] == "this machine, drawn" and metadata["alt"] == "2 cores, no GPU"
