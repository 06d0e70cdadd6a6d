package idempotency_test

import (
	"bytes"
	"errors"
	"fmt"
	"math/big"
	"slices"
	"strings"
	"unicode/utf16"
	"unicode/utf8"
)

// This file holds the fuzz targets of the canonical JSON form and a
// reference JSON parser, written independently of encoding/json, that the
// targets compare CanonicalJSON with. Run one target with, for example:
//
//	go test -run='^$' -fuzz='^FuzzCanonicalJSON$' -fuzztime=20s .
//
// Its seeds (the f.Add calls and testdata/fuzz/<name>/) run in a plain
// go test.

// refValue is one JSON value as the reference parser understands it.
type refValue struct {
	kind byte // 'n' null, 't' true, 'f' false, 's' string, 'd' number, 'a' array, 'o' object
	str  string
	num  refNumber
	arr  []refValue
	obj  map[string]refValue
}

// refNumber is (-1)^neg * mant * 10^exp, exactly.
type refNumber struct {
	neg  bool
	mant *big.Int // >= 0
	exp  *big.Int
	lit  string
}

// refMaxDepth is encoding/json's nesting limit; the reference does not
// judge texts that reach it.
const refMaxDepth = 10000

var errRefDepth = errors.New("ref: nesting at encoding/json's limit")

type refParser struct {
	s     []byte
	i     int
	depth int
}

// refParse parses data as exactly one JSON value by RFC 8259, plus the
// rules CanonicalJSON adds: UTF-8 only, no unpaired surrogate escape, no
// duplicate member name.
func refParse(data []byte) (refValue, error) {
	p := &refParser{s: data}
	p.ws()
	v, err := p.value()
	if err != nil {
		return refValue{}, err
	}
	p.ws()
	if p.i != len(p.s) {
		return refValue{}, fmt.Errorf("ref: data after the value at %d", p.i)
	}
	return v, nil
}

func (p *refParser) ws() {
	for p.i < len(p.s) && strings.IndexByte(" \t\n\r", p.s[p.i]) >= 0 {
		p.i++
	}
}

func (p *refParser) fail(what string) error {
	return fmt.Errorf("ref: %s at %d", what, p.i)
}

func (p *refParser) literal(word string, kind byte) (refValue, error) {
	if !bytes.HasPrefix(p.s[p.i:], []byte(word)) {
		return refValue{}, p.fail("bad literal")
	}
	p.i += len(word)
	return refValue{kind: kind}, nil
}

func (p *refParser) value() (refValue, error) {
	if p.i >= len(p.s) {
		return refValue{}, p.fail("unexpected end")
	}
	switch c := p.s[p.i]; {
	case c == 'n':
		return p.literal("null", 'n')
	case c == 't':
		return p.literal("true", 't')
	case c == 'f':
		return p.literal("false", 'f')
	case c == '"':
		s, err := p.string()
		return refValue{kind: 's', str: s}, err
	case c == '-' || c >= '0' && c <= '9':
		n, err := p.number()
		return refValue{kind: 'd', num: n}, err
	case c == '[' || c == '{':
		p.depth++
		if p.depth >= refMaxDepth {
			return refValue{}, errRefDepth
		}
		defer func() { p.depth-- }()
		if c == '[' {
			return p.array()
		}
		return p.object()
	}
	return refValue{}, p.fail("unexpected byte")
}

func (p *refParser) array() (refValue, error) {
	p.i++
	v := refValue{kind: 'a', arr: []refValue{}}
	p.ws()
	if p.i < len(p.s) && p.s[p.i] == ']' {
		p.i++
		return v, nil
	}
	for {
		p.ws()
		e, err := p.value()
		if err != nil {
			return refValue{}, err
		}
		v.arr = append(v.arr, e)
		p.ws()
		if p.i >= len(p.s) {
			return refValue{}, p.fail("unterminated array")
		}
		p.i++
		switch p.s[p.i-1] {
		case ']':
			return v, nil
		case ',':
		default:
			return refValue{}, p.fail("bad array separator")
		}
	}
}

func (p *refParser) object() (refValue, error) {
	p.i++
	v := refValue{kind: 'o', obj: map[string]refValue{}}
	p.ws()
	if p.i < len(p.s) && p.s[p.i] == '}' {
		p.i++
		return v, nil
	}
	for {
		p.ws()
		if p.i >= len(p.s) || p.s[p.i] != '"' {
			return refValue{}, p.fail("member name expected")
		}
		k, err := p.string()
		if err != nil {
			return refValue{}, err
		}
		if _, dup := v.obj[k]; dup {
			return refValue{}, p.fail("duplicate member name")
		}
		p.ws()
		if p.i >= len(p.s) || p.s[p.i] != ':' {
			return refValue{}, p.fail("colon expected")
		}
		p.i++
		p.ws()
		e, err := p.value()
		if err != nil {
			return refValue{}, err
		}
		v.obj[k] = e
		p.ws()
		if p.i >= len(p.s) {
			return refValue{}, p.fail("unterminated object")
		}
		p.i++
		switch p.s[p.i-1] {
		case '}':
			return v, nil
		case ',':
		default:
			return refValue{}, p.fail("bad object separator")
		}
	}
}

func (p *refParser) hex4() (rune, bool) {
	if p.i+4 > len(p.s) {
		return 0, false
	}
	var r rune
	for _, c := range p.s[p.i : p.i+4] {
		var d rune
		switch {
		case c >= '0' && c <= '9':
			d = rune(c - '0')
		case c >= 'a' && c <= 'f':
			d = rune(c-'a') + 10
		case c >= 'A' && c <= 'F':
			d = rune(c-'A') + 10
		default:
			return 0, false
		}
		r = r*16 + d
	}
	p.i += 4
	return r, true
}

func (p *refParser) string() (string, error) {
	p.i++ // opening quote
	var out []rune
	for {
		if p.i >= len(p.s) {
			return "", p.fail("unterminated string")
		}
		c := p.s[p.i]
		switch {
		case c == '"':
			p.i++
			return string(out), nil
		case c < 0x20:
			return "", p.fail("control character in string")
		case c == '\\':
			p.i++
			if p.i >= len(p.s) {
				return "", p.fail("unterminated escape")
			}
			e := p.s[p.i]
			p.i++
			if j := strings.IndexByte(`"\/bfnrt`, e); j >= 0 {
				out = append(out, rune("\"\\/\b\f\n\r\t"[j]))
				continue
			}
			if e != 'u' {
				return "", p.fail("bad escape")
			}
			r, ok := p.hex4()
			if !ok {
				return "", p.fail("bad \\u escape")
			}
			if utf16.IsSurrogate(r) {
				if r >= 0xdc00 || !bytes.HasPrefix(p.s[p.i:], []byte(`\u`)) {
					return "", p.fail("unpaired surrogate")
				}
				p.i += 2
				lo, ok := p.hex4()
				if !ok || lo < 0xdc00 || lo > 0xdfff {
					return "", p.fail("unpaired surrogate")
				}
				r = utf16.DecodeRune(r, lo)
			}
			out = append(out, r)
		default:
			r, n := utf8.DecodeRune(p.s[p.i:])
			if r == utf8.RuneError && n <= 1 {
				return "", p.fail("invalid UTF-8")
			}
			out = append(out, r)
			p.i += n
		}
	}
}

func (p *refParser) digits() string {
	start := p.i
	for p.i < len(p.s) && p.s[p.i] >= '0' && p.s[p.i] <= '9' {
		p.i++
	}
	return string(p.s[start:p.i])
}

func (p *refParser) number() (refNumber, error) {
	start := p.i
	n := refNumber{exp: new(big.Int)}
	if p.s[p.i] == '-' {
		n.neg = true
		p.i++
	}
	intPart := p.digits()
	if intPart == "" || len(intPart) > 1 && intPart[0] == '0' {
		return n, p.fail("bad integer part")
	}
	var frac string
	if p.i < len(p.s) && p.s[p.i] == '.' {
		p.i++
		if frac = p.digits(); frac == "" {
			return n, p.fail("bad fraction")
		}
	}
	if p.i < len(p.s) && (p.s[p.i] == 'e' || p.s[p.i] == 'E') {
		p.i++
		sign := ""
		if p.i < len(p.s) && (p.s[p.i] == '+' || p.s[p.i] == '-') {
			sign = string(p.s[p.i])
			p.i++
		}
		d := p.digits()
		if d == "" {
			return n, p.fail("bad exponent")
		}
		n.exp.SetString(sign+d, 10)
	}
	n.mant, _ = new(big.Int).SetString(intPart+frac, 10)
	n.exp.Sub(n.exp, big.NewInt(int64(len(frac))))
	n.lit = string(p.s[start:p.i])
	return n, nil
}

// refNumEqual compares two numbers exactly: with big.Rat when the
// exponents are small, else by bounding the digits.
func refNumEqual(a, b refNumber) bool {
	if a.mant.Sign() == 0 || b.mant.Sign() == 0 {
		return a.mant.Sign() == b.mant.Sign() // -0 equals 0
	}
	if a.neg != b.neg {
		return false
	}
	limit := big.NewInt(2000)
	small := func(e *big.Int) bool { return new(big.Int).Abs(e).Cmp(limit) <= 0 }
	if small(a.exp) && small(b.exp) {
		ra, _ := new(big.Rat).SetString(a.lit)
		rb, _ := new(big.Rat).SetString(b.lit)
		return ra.Cmp(rb) == 0
	}
	// a = ma*10^ea, b = mb*10^eb. Scale the one with the larger exponent by
	// d = |ea-eb|: if d exceeds the other's digit count it is larger.
	hi, lo := a, b
	if a.exp.Cmp(b.exp) < 0 {
		hi, lo = b, a
	}
	d := new(big.Int).Sub(hi.exp, lo.exp)
	if d.Cmp(big.NewInt(int64(len(lo.mant.String())))) > 0 {
		return false
	}
	scaled := new(big.Int).Exp(big.NewInt(10), d, nil)
	scaled.Mul(scaled, hi.mant)
	return scaled.Cmp(lo.mant) == 0
}

func refEqual(a, b refValue) bool {
	if a.kind != b.kind {
		return false
	}
	switch a.kind {
	case 's':
		return a.str == b.str
	case 'd':
		return refNumEqual(a.num, b.num)
	case 'a':
		return slices.EqualFunc(a.arr, b.arr, refEqual)
	case 'o':
		if len(a.obj) != len(b.obj) {
			return false
		}
		for k, av := range a.obj {
			bv, ok := b.obj[k]
			if !ok || !refEqual(av, bv) {
				return false
			}
		}
	}
	return true
}

// refRender writes v in another, equally valid spelling: members in reverse
// order, every character escaped as \uXXXX in upper case, numbers written
// as 0.DDD00E+N, extra whitespace. It must canonicalise as v does.
func refRender(b *strings.Builder, v refValue) {
	switch v.kind {
	case 'n':
		b.WriteString("null")
	case 't':
		b.WriteString("true")
	case 'f':
		b.WriteString("false")
	case 's':
		refRenderString(b, v.str)
	case 'd':
		if v.num.neg || v.num.mant.Sign() == 0 {
			b.WriteByte('-') // -0 is 0
		}
		m := v.num.mant.String()
		e := new(big.Int).Add(v.num.exp, big.NewInt(int64(len(m))))
		fmt.Fprintf(b, "0.%s00E%+d", m, e)
	case 'a':
		b.WriteString("[ ")
		for i, e := range v.arr {
			if i > 0 {
				b.WriteString(" ,\n")
			}
			refRender(b, e)
		}
		b.WriteString("\t]")
	case 'o':
		keys := make([]string, 0, len(v.obj))
		for k := range v.obj {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		slices.Reverse(keys)
		b.WriteString("{\r\n")
		for i, k := range keys {
			if i > 0 {
				b.WriteString(",")
			}
			refRenderString(b, k)
			b.WriteString(" : ")
			refRender(b, v.obj[k])
		}
		b.WriteString(" }")
	}
}

func refRenderString(b *strings.Builder, s string) {
	b.WriteByte('"')
	for _, r := range s {
		if r > 0xffff {
			r1, r2 := utf16.EncodeRune(r)
			fmt.Fprintf(b, `\u%04X\u%04X`, r1, r2)
			continue
		}
		fmt.Fprintf(b, `\u%04X`, r)
	}
	b.WriteByte('"')
}
