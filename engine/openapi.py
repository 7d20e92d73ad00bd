"""Request-body schemas for the engine's OpenAPI document (FastAPI's /openapi.json).

The routes read the raw body themselves (so that every bad input becomes a 400 in OpenAI's shape,
not FastAPI's 422), which leaves FastAPI nothing to describe; these schemas say what the parser in
`engine.protocol` accepts, so that clients and fuzzers (schemathesis) know the API's shape.
"""

from __future__ import annotations

_ERROR = {"type": "object", "required": ["error"],
          "properties": {"error": {"type": "object", "required": ["message", "type"],
                                   "properties": {"message": {"type": "string"}, "type": {"type": "string"},
                                                  "param": {"type": ["string", "null"]}, "code": {}}}}}

_SAMPLING = {
    "model": {"type": "string"},
    "max_tokens": {"type": "integer", "minimum": 1},
    "temperature": {"type": "number", "minimum": 0},
    "top_p": {"type": "number", "exclusiveMinimum": 0, "maximum": 1},
    "top_k": {"type": "integer"},
    "seed": {"type": "integer"},
    "n": {"type": "integer", "const": 1},
    "stop": {"oneOf": [{"type": "string", "minLength": 1},
                       {"type": "array", "items": {"type": "string", "minLength": 1}}]},
    "stop_token_ids": {"type": "array", "items": {"type": "integer", "minimum": 0}},
    "ignore_eos": {"type": "boolean"},
    "stream": {"type": "boolean"},
    "stream_options": {"type": "object", "properties": {"include_usage": {"type": "boolean"}}},
    "cache_salt": {"type": "string"},
}

COMPLETION = {"type": "object", "required": ["prompt"],
              "properties": {**_SAMPLING, "prompt": {"oneOf": [
                  {"type": "string", "minLength": 1},
                  {"type": "array", "minItems": 1, "items": {"type": "integer", "minimum": 0}}]}}}

CHAT = {"type": "object", "required": ["messages"],
        "properties": {**_SAMPLING, "max_completion_tokens": {"type": "integer", "minimum": 1},
                       "messages": {"type": "array", "minItems": 1, "items": {
                           "type": "object", "required": ["role", "content"],
                           "properties": {"role": {"type": "string"}, "content": {"type": "string"}}}}}}


def operation(schema: dict) -> dict:
    """`openapi_extra` for a POST route whose JSON body follows `schema`."""
    error = {"description": "Bad input, in OpenAI's error shape", "content": {"application/json": {"schema": _ERROR}}}
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": schema}}},
            "responses": {"400": error, "404": error}}
