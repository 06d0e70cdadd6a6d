package backend

import "fmt"

// LookupPolicy says when a SQL store reads a key with a plain look-up,
// outside any transaction, before it reserves the key. A look-up first
// answers a replay in one round trip and costs a new key one more. A
// store's documentation gives its round trips under each policy.
type LookupPolicy int

// The look-up policies a store's Config takes.
const (
	// LookupAdaptive, the zero value, looks up first only while most of
	// the store's recent first tries found a completed key.
	LookupAdaptive LookupPolicy = iota
	// LookupAlways looks every key up first.
	LookupAlways
	// LookupNever reserves every key straight away. No policy ever runs
	// an effect twice.
	LookupNever
)

// String returns the constant's name.
func (p LookupPolicy) String() string {
	switch p {
	case LookupAdaptive:
		return "LookupAdaptive"
	case LookupAlways:
		return "LookupAlways"
	case LookupNever:
		return "LookupNever"
	}
	return fmt.Sprintf("LookupPolicy(%d)", int(p))
}

// Validate returns an error wrapping [ErrInvalidConfig] unless p is one of
// the policies above. A store calls it in its constructor.
func (p LookupPolicy) Validate() error {
	switch p {
	case LookupAdaptive, LookupAlways, LookupNever:
		return nil
	}
	return fmt.Errorf("%w: unknown look-up policy %v", ErrInvalidConfig, p)
}
