"""The dashboard's widgets: keyed tables, the numbers panel, the fleet and events tables, and the
modal dialogs (confirm, prompt, help)."""
