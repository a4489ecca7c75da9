"""Request and response bodies of the REST API, one module per resource, validated by
Pydantic: a bad request is answered with 422 naming each bad field before anything is
written. Conversions to the model's plain data live beside the bodies."""
