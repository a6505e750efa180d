package triagev1

import _ "embed" // for OpenAPI

// OpenAPI is the OpenAPI 2.0 (Swagger) document of the JSON gateway's
// routes, triage.swagger.json as `make generate` writes it beside this
// file. It is embedded so that a router serves the description of the
// very API it runs (cmd/triage/node serves it at /openapi.json). A
// program that never refers to it, such as one using only the client
// package, does not link it: the linker drops unreferenced variables.
//
//go:embed triage.swagger.json
var OpenAPI []byte
