"""The token embeddings of the families that build their own model (MSC, Prime), as fairseq's
``TransformerModel.build_model`` builds them."""


def build_embeddings(args, src_dict, tgt_dict, build_embedding):
    """(encoder's, decoder's) token embeddings, each ``build_embedding(dictionary, dim, path)``.

    With ``--share-all-embeddings`` one table serves both sides and the decoder's output
    (``args.share_decoder_input_output_embed`` is set), refused, with fairseq's own messages, for separate
    dictionaries, two widths, or a ``--decoder-embed-path`` other than the encoder's (one table cannot load two
    files); otherwise one table per side."""
    if not args.share_all_embeddings:
        return (build_embedding(src_dict, args.encoder_embed_dim, args.encoder_embed_path),
                build_embedding(tgt_dict, args.decoder_embed_dim, args.decoder_embed_path))
    if src_dict != tgt_dict:
        raise ValueError("--share-all-embeddings requires a joined dictionary")
    if args.encoder_embed_dim != args.decoder_embed_dim:
        raise ValueError("--share-all-embeddings requires --encoder-embed-dim to match --decoder-embed-dim")
    if args.decoder_embed_path and args.decoder_embed_path != args.encoder_embed_path:
        raise ValueError("--share-all-embeddings not compatible with --decoder-embed-path")
    shared = build_embedding(src_dict, args.encoder_embed_dim, args.encoder_embed_path)
    args.share_decoder_input_output_embed = True
    return shared, shared
