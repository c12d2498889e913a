"""Suite ``w12_bits``: W12 bits per weight and escape rates on the trained checkpoints that ship in
packages (CPU; see ``w12.bits``)."""

from w12.bits import add_bits_args, bits_suite

from ..harness.bench import register_suite

register_suite("w12_bits", add_args=add_bits_args)(bits_suite)
