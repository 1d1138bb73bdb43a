"""FourierFormer for fairseq: Fourier integral attention with fused CPU and CUDA kernels."""
__version__ = "0.1.0"
