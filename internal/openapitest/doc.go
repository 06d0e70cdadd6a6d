// Package openapitest validates the OpenAPI fragment of idemhttp with a
// real OpenAPI library, kept out of the core module's go.mod.
package openapitest
