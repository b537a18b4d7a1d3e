"""How tables label kernels: short, one line, and different for different kernels."""

from __future__ import annotations

import pytest

from detprof.traces.kernel_names import DISPLAY_CHARS, display_kernel_names

CUDNN_A = "void cudnn::cnn::wgrad_alg0_engine<float, 128, 6, 8, 3, 3, 5, false, 512>(int, int, float const*, float*)"
CUDNN_B = "void cudnn::cnn::wgrad_alg0_engine<float, 512, 6, 5, 3, 3, 3, true, 512>(int, int, float const*, float*)"
BUFFERS = ", ".join(["clover::Buffer2D<double> &"] * 14)
CLOVER = "void clover::par_ranged2d_kernel<{k}(bool, int, {b})::[lambda(int, int) (instance {i})]>(clover::Range2d, T1)"


def clover(kernel: str, instance: int) -> str:
    return CLOVER.format(k=kernel, b=BUFFERS, i=instance)


def test_a_unique_short_name_is_shown_alone() -> None:
    names = ["volta_sgemm_128x64_nn", "void tensorflow::BiasNHWCKernel<float>(int, float const*)", CUDNN_A]
    assert display_kernel_names(names) == ["volta_sgemm_128x64_nn", "BiasNHWCKernel", "wgrad_alg0_engine"]


def test_template_instances_sharing_a_short_name_show_their_arguments() -> None:
    assert display_kernel_names([CUDNN_A, CUDNN_B]) == [
        "wgrad_alg0_engine<float, 128, 6, 8, 3, 3, 5, false, 512>",
        "wgrad_alg0_engine<float, 512, 6, 5, 3, 3, 3, true, 512>",
    ]


def test_lambdas_keep_their_kernel_and_instance_and_lose_parameter_lists() -> None:
    names = [clover("PdV_kernel", 1), clover("PdV_kernel", 2), clover("advec_mom_kernel", 11)]
    labels = display_kernel_names(names)
    assert labels[:2] == [
        "par_ranged2d_kernel<PdV_kernel(…)::[lambda(…) (instance 1)]>",
        "par_ranged2d_kernel<PdV_kernel(…)::[lambda(…) (instance 2)]>",
    ]
    assert labels[2].startswith("par_ranged2d_kernel<advec_mom_kernel") and labels[2].endswith("(instance 11)]>")
    assert all(len(label) <= DISPLAY_CHARS for label in labels)
    assert "clover::" not in "".join(labels)


def test_labels_that_still_read_the_same_are_numbered_in_table_order() -> None:
    names = ["void ns::Outer<int>::run(int)", "void ns::Outer<float>::run(int)", "void other()"]
    assert display_kernel_names(names) == ["run #1", "run #2", "other"]


@pytest.mark.parametrize("width", [12, 30, 60])
def test_long_arguments_are_cut_in_the_middle_to_the_width(width: int) -> None:
    names = [f"void k<{'a' * 100}, {i}>(int)" for i in range(2)]
    labels = display_kernel_names(names, max_chars=width)
    assert all(len(label) <= width for label in labels) and len(set(labels)) == 2
    assert all(label.startswith("k<a") and "…" in label for label in labels)
    assert [label[-3:] for label in labels] == [" 0>", " 1>"]


def test_a_long_name_without_template_arguments_is_cut_in_the_middle_too() -> None:
    """ROCm's Tensile kernels are hundreds of characters of one identifier; two of them stay apart."""
    tensile = "Cijk_Alik_Bljk_SB_Bias_AS_SAV_UserArgs_MT64x16x32_MI16x16x1_" + "SN_LDSB0_AFC1_" * 20 + "WG64_4_1"
    other = tensile.replace("MT64x16x32", "MT64x16x16")[:-1] + "2"
    labels = display_kernel_names([tensile, other])
    assert all(len(label) <= DISPLAY_CHARS for label in labels)
    assert labels[0].startswith("Cijk_Alik_Bljk") and labels[0].endswith("WG64_4_1")
    assert labels[0] != labels[1]


@pytest.mark.parametrize("width", [20, 40])
def test_numbered_labels_keep_their_numbers_within_the_width(width: int) -> None:
    """Kernels whose cut labels read the same are numbered, the number inside the width the table gave: a number past
    the column's edge would be cut off, and the rows read the same again."""
    names = [f"void ns::{'Outer' * 8}<{t}>::run_a_very_long_kernel_name_{'x' * 30}(int)" for t in ("int", "float")]
    names += [f"void {'y' * 80}()", f"void {'y' * 80}()"[:-3] + "(float)"]
    labels = display_kernel_names(names, max_chars=width)
    assert all(len(label) <= width for label in labels), labels
    assert len(set(labels)) == len(labels) and labels[0].endswith(" #1") and labels[1].endswith(" #2")
