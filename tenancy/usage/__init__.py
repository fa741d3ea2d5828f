"""What was spent: the usage record, usage rows, the durable spool and its codec, the writer, rollups and reports."""
