"""The JSON schemas bench/grammar.py --json times: function-call arguments, records with formats, nested objects with
optional properties, arrays of objects, enums, integer ranges, anyOf unions, a recursive $defs tree and
additionalProperties maps. Every object with `properties` says `additionalProperties` explicitly: where it is absent,
JSON Schema allows any other member while tinyllm's convention (tinyllm/grammar/json_schema.py) and xgrammar's
strict mode allow none, and the bench compares the engines on one language."""

_STR = {"type": "string"}
_INT = {"type": "integer"}


def _obj(properties, required=(), **extra):
    return dict(type="object", properties=properties, required=list(required), additionalProperties=False, **extra)


SCHEMAS = {
    "get_weather": _obj({
        "location": {"type": "string", "description": "City and country, e.g. Paris, France"},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
    }, ["location", "unit"]),
    "search_flights": _obj({
        "origin": {"type": "string", "pattern": "^[A-Z]{3}$"},
        "destination": {"type": "string", "pattern": "^[A-Z]{3}$"},
        "date": {"type": "string", "format": "date"},
        "passengers": {"type": "integer", "minimum": 1, "maximum": 9},
        "cabin": {"enum": ["economy", "premium", "business", "first"]},
        "nonstop": {"type": "boolean"},
    }, ["origin", "destination", "date"]),
    "send_email": _obj({
        "to": {"type": "array", "items": {"type": "string", "format": "email"}, "minItems": 1, "maxItems": 5},
        "cc": {"type": "array", "items": {"type": "string", "format": "email"}, "maxItems": 3},
        "subject": {"type": "string", "maxLength": 120},
        "body": _STR,
        "priority": {"enum": ["low", "normal", "high"]},
    }, ["to", "subject", "body"]),
    "user_record": _obj({
        "id": {"type": "string", "format": "uuid"},
        "name": {"type": "string", "minLength": 1, "maxLength": 64},
        "email": {"type": "string", "format": "email"},
        "birth_date": {"type": "string", "format": "date"},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
        "is_active": {"type": "boolean"},
        "roles": {"type": "array", "items": {"enum": ["admin", "editor", "viewer"]}, "maxItems": 3},
    }, ["id", "name", "email"]),
    "address_book": _obj({
        "owner": _STR,
        "contacts": {"type": "array", "maxItems": 4, "items": _obj({
            "name": _STR,
            "phone": {"type": "string", "pattern": "^\\+?[0-9]{7,15}$"},
            "address": _obj({
                "street": _STR, "city": _STR,
                "zip": {"type": "string", "pattern": "^[0-9]{5}$"},
                "country": {"type": "string", "enum": ["US", "FR", "DE", "JP"]},
            }, ["street", "city"]),
        }, ["name"])},
    }, ["owner", "contacts"]),
    "order": _obj({
        "order_id": {"type": "integer", "minimum": 1},
        "created": {"type": "string", "format": "date-time"},
        "items": {"type": "array", "minItems": 1, "maxItems": 5, "items": _obj({
            "sku": {"type": "string", "pattern": "^[A-Z]{2}-[0-9]{4}$"},
            "quantity": {"type": "integer", "minimum": 1, "maximum": 100},
            "price": {"type": "number", "minimum": 0},
        }, ["sku", "quantity", "price"])},
        "status": {"enum": ["pending", "paid", "shipped", "cancelled"]},
        "note": {"type": ["string", "null"]},
    }, ["order_id", "items", "status"]),
    "log_event": _obj({
        "level": {"enum": ["debug", "info", "warning", "error"]},
        "timestamp": {"type": "string", "format": "date-time"},
        "host": {"type": "string", "format": "hostname"},
        "ip": {"type": "string", "format": "ipv4"},
        "message": _STR,
        "code": {"type": "integer", "minimum": 100, "maximum": 599},
    }, ["level", "timestamp", "message"]),
    "classification": _obj({
        "label": {"enum": ["positive", "negative", "neutral", "mixed"]},
        "confidence": {"type": "number", "minimum": 0, "maximum": 1},
        "reasons": {"type": "array", "items": _STR, "maxItems": 3},
    }, ["label", "confidence"]),
    "int_ranges": _obj({
        "year": {"type": "integer", "minimum": 1900, "maximum": 2100},
        "month": {"type": "integer", "minimum": 1, "maximum": 12},
        "day": {"type": "integer", "minimum": 1, "maximum": 31},
        "offset": {"type": "integer", "minimum": -720, "maximum": 840},
        "count": {"type": "integer", "exclusiveMinimum": 0},
    }, ["year", "month", "day"]),
    "shape_union": _obj({
        "shape": {"anyOf": [
            _obj({"kind": {"const": "circle"}, "radius": {"type": "number", "minimum": 0}}, ["kind", "radius"]),
            _obj({"kind": {"const": "rect"}, "width": {"type": "number", "minimum": 0},
                  "height": {"type": "number", "minimum": 0}}, ["kind", "width", "height"]),
            _obj({"kind": {"const": "polygon"},
                  "points": {"type": "array", "minItems": 3, "maxItems": 6,
                             "items": {"type": "array", "prefixItems": [{"type": "number"}, {"type": "number"}],
                                       "items": False, "minItems": 2}}}, ["kind", "points"]),
        ]},
        "color": {"anyOf": [{"type": "string", "pattern": "^#[0-9a-f]{6}$"}, {"type": "null"}]},
    }, ["shape"]),
    "tool_call": _obj({
        "name": {"enum": ["search", "calculator", "calendar"]},
        "arguments": {"anyOf": [
            _obj({"query": _STR, "top_k": {"type": "integer", "minimum": 1, "maximum": 20}}, ["query"]),
            _obj({"expression": _STR}, ["expression"]),
            _obj({"start": {"type": "string", "format": "date-time"}, "duration_minutes": _INT}, ["start"]),
        ]},
    }, ["name", "arguments"]),
    "file_tree": {
        "$defs": {"node": _obj({
            "name": {"type": "string", "minLength": 1},
            "size": {"type": "integer", "minimum": 0},
            "children": {"type": "array", "items": {"$ref": "#/$defs/node"}, "maxItems": 3},
        }, ["name"])},
        "$ref": "#/$defs/node",
    },
    "expression_tree": {
        "$defs": {"expr": {"anyOf": [
            {"type": "number"},
            _obj({"op": {"enum": ["+", "-", "*", "/"]},
                  "args": {"type": "array", "items": {"$ref": "#/$defs/expr"}, "minItems": 2, "maxItems": 3}},
                 ["op", "args"]),
        ]}},
        "$ref": "#/$defs/expr",
    },
    "headers_map": _obj({
        "url": _STR,
        "method": {"enum": ["GET", "POST", "PUT", "DELETE"]},
        "headers": {"type": "object", "additionalProperties": _STR},
        "query": {"type": "object", "additionalProperties": {"type": ["string", "integer", "boolean"]}},
    }, ["url", "method"]),
    "scores_map": {"type": "object", "additionalProperties": {"type": "integer", "minimum": 0, "maximum": 100}},
    "product_catalog": {"type": "array", "maxItems": 4, "items": _obj({
        "id": {"type": "string", "format": "uuid"},
        "title": {"type": "string", "maxLength": 80},
        "tags": {"type": "array", "items": {"type": "string", "pattern": "^[a-z]+$"}, "maxItems": 4},
        "price": {"type": "number", "minimum": 0, "maximum": 100000},
        "in_stock": {"type": "boolean"},
        "dimensions": _obj({"w": {"type": "number"}, "h": {"type": "number"}, "d": {"type": "number"}},
                           ["w", "h", "d"]),
    }, ["id", "title", "price"])},
}
