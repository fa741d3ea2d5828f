"""`weir db` and `weir admin`: every command module and every admin client behind them."""
