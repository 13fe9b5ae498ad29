"""tools/make_site.py: a figure's text alternative reaches the site's <img>."""

import nbformat
from bs4 import BeautifulSoup

import make_site

PNG = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAAAAAA6fptVAAAACklEQVR4nGNgAAAAAgABSK+kcQAAAABJRU5ErkJggg=="


def test_the_alt_an_output_carries_is_put_on_its_img_and_an_output_without_one_is_left_alone():
    described = nbformat.v4.new_code_cell("show()")
    described.outputs = [
        nbformat.v4.new_output("display_data", data={"image/png": PNG}, metadata={"alt": 'ranks 0 & 1 hold "3"'})
    ]
    plain = nbformat.v4.new_code_cell("plot()")
    plain.outputs = [nbformat.v4.new_output("display_data", data={"image/png": PNG})]
    nb = nbformat.v4.new_notebook(cells=[described, plain])
    body, _ = make_site.notebook_exporter().from_notebook_node(nb)
    body = make_site.with_alt_texts(body, nb)
    alts = [img["alt"] for img in BeautifulSoup(body, features="html.parser").select("img")]
    assert alts == ['ranks 0 & 1 hold "3"', "No description has been provided for this image"]
