package idemhttp

// The names below are unexported from the API (the docs state their
// values); the external tests compare with them under their old names.
const (
	ProblemMissingKey       = problemMissingKey
	ProblemInvalidKey       = problemInvalidKey
	ProblemInvalidBody      = problemInvalidBody
	ProblemRequestTooLarge  = problemRequestTooLarge
	ProblemOverQuota        = problemOverQuota
	ProblemResponseTooLarge = problemResponseTooLarge
	ProblemNoResponse       = problemNoResponse
	ProblemInternal         = problemInternal
	ProblemStoreUnavailable = problemStoreUnavailable
	ProblemUnfinished       = problemUnfinished
	ProblemUnknownOperation = problemUnknownOperation
	ProblemContentType      = problemContentType
	ProblemSchemaName       = problemSchemaName
	MinStatusSecretLen      = minStatusSecretLen
	HeaderShouldRetry       = headerShouldRetry
)

// StripeError is the error object WriteStripeError writes.
type StripeError = stripeError

// StripeErrorOf and IsInProgress are the unexported helpers, for tests.
var (
	StripeErrorOf = stripeErrorOf
	IsInProgress  = isInProgress
)
