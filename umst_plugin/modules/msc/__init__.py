"""MSC (Wei et al., ACL 2020): block-collaborative layers and the encoder gradient-norm logger."""
