"""`weir admin`: every command module and every admin client behind them (`weir db` is weir.migrations.cli)."""
