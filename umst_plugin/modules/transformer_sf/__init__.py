"""TranSFormer (Li et al., ACL 2023): character table, fast-branch attention, cross-granularity fusion, encoder."""
