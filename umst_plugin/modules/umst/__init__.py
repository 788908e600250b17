"""UMST (Li et al., ICML 2022): scale graphs, the encoder layer, GCNs, rectified self-attention."""
