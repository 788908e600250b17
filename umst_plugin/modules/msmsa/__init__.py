"""MSMSA (Guo et al., AAAI 2020): multi-scale windowed attention and its fairseq layers."""
