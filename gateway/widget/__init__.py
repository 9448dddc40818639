"""The embeddable chat widget: its script, public config, end-user sessions, admin settings,
CORS, and the demo page. ``gateway.widget.routes.register_widget(app, settings)`` adds it all."""
