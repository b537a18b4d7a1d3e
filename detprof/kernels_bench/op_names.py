"""The op names that the bench's runner and its read side share.

The convolutions are the ops every backend's suite has, measured at each of the medium
CNN's kernel sizes; the report and the case summaries tell them apart from the other ops
by these names, without importing the runner that derives the cases.
"""

CONV_OPS = ("conv2d_forward", "conv2d_backward_data", "conv2d_backward_filter")
