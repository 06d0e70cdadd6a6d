// Package shape is a package of known shape for apisurface's test.
package shape

// A and B are consts; b is not exported.
const (
	A = 1
	B = 2
	b = 3
)

// C is a var.
var C = 4

// X is a func.
func X() {}

// T is a type with two exported methods and one unexported.
type T struct{ n int }

// Y is a constructor go/doc files under T.
func Y() T { return T{} }

// Get is a method.
func (t T) Get() int { return t.n }

// String is a method.
func (t T) String() string { return "" }

func (t T) hidden() {}

// I is an interface with one exported method.
type I interface {
	M()
	m()
}
