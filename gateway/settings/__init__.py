"""The `weir serve` settings: each declared once (setting_field.py), in groups, joined by settings.Settings;
the env reader, flags, docs table and Helm values are derived from the declarations. The ground floor
of the gateway: it imports nothing from the gateway's other wings."""
