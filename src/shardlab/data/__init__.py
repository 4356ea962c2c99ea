"""Tokenized training data: ``shardlab data prepare`` and the folders it writes.

:mod:`~shardlab.data.tokenizer` reads a Hugging Face ``tokenizer.json`` (and decides
whether the cached encoder may be used), :mod:`~shardlab.data.encode` turns documents
into token ids, :mod:`~shardlab.data.sources` reads text and JSONL files as documents,
:mod:`~shardlab.data.prepare` writes the shards (one process per input file), and
:mod:`~shardlab.data.manifest` describes, checks and reads a prepared folder for
``shardlab train --data DIR``. Free of torch; reading a prepared folder needs numpy only
(``tokenizers`` is needed to prepare one).
"""
