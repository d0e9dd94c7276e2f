"""GPU kernels shipped with the fleet's engine adapters (plain package, no project imports).

`kernels.wo_a_w8`: fp8 twins of the wo_a weights and their Triton kernels (issue 9).
"""
