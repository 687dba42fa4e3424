//! keel's durable model on redb (DESIGN.md §5).
