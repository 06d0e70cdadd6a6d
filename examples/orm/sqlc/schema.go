package main

import _ "embed"

// schemaSQL is schema.sql, the orders table sqlc generated code for.
//
//go:embed schema.sql
var schemaSQL string
