"""The names of the platform's own images (stacks/image_names.py): the analysers read back what the pipeline writes."""

from __future__ import annotations

from stacks.image_names import image_of_parameter, image_parameter_name


def test_an_image_parameter_name_reads_back_as_its_project_and_image() -> None:
    name = image_parameter_name("pytorch-platform", "graviton-serving")
    assert image_of_parameter(name) == ("pytorch-platform", "graviton-serving")


def test_other_parameter_names_are_no_image_parameters() -> None:
    name = image_parameter_name("pytorch-platform", "training")
    for other in (name + "/latest", name.removeprefix("/"), "/aws/service/deeplearning/ami/x86_64/base/latest/ami-id"):
        assert image_of_parameter(other) is None, other
