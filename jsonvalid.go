package outbox

import "unicode/utf8"

// validJSON reports whether b is exactly one JSON value (RFC 8259, surrounded by optional
// whitespace) whose strings are valid UTF-8: utf8.Valid(b) && json.Valid(b), in one pass
// and without allocating.
//
// Enqueue must check every payload, and encoding/json's checker, a state machine
// that calls a function per byte, was the largest client-side cost of a batch enqueue:
// about 1.8 µs of a 350-byte event, a quarter of the engine's own work (BenchmarkValidate,
// BENCHMARKS.md). This recursive-descent checker does the same in a fraction of that. It
// follows encoding/json exactly, down to its nesting limit, and FuzzValidJSON holds it to
// that; it accepts the same \u escapes (any four hex digits, lone surrogates included).
func validJSON(b []byte) bool {
	i, ok := jsonValue(b, jsonSpace(b, 0), 0)
	return ok && jsonSpace(b, i) == len(b)
}

// jsonMaxDepth is encoding/json's nesting limit: 10000 open arrays and objects.
const jsonMaxDepth = 10000

// jsonSpace returns the index of the first byte at or after i that is not JSON whitespace.
func jsonSpace(b []byte, i int) int {
	for i < len(b) && (b[i] == ' ' || b[i] == '\n' || b[i] == '\t' || b[i] == '\r') {
		i++
	}
	return i
}

// jsonValue checks the value starting at b[i] inside depth open containers and returns the
// index after it.
func jsonValue(b []byte, i, depth int) (int, bool) {
	if i >= len(b) {
		return i, false
	}
	switch c := b[i]; {
	case c == '{' || c == '[':
		if depth == jsonMaxDepth {
			return i, false
		}
		return jsonContainer(b, i, depth+1)
	case c == '"':
		return jsonString(b, i)
	case c == '-' || isDigit(c):
		return jsonNumber(b, i)
	case c == 't':
		return jsonLiteral(b, i, "true")
	case c == 'f':
		return jsonLiteral(b, i, "false")
	case c == 'n':
		return jsonLiteral(b, i, "null")
	}
	return i, false
}

// jsonContainer checks the object or array opening at b[i], itself the depth-th open one.
func jsonContainer(b []byte, i, depth int) (int, bool) {
	object := b[i] == '{'
	end := byte(']')
	if object {
		end = '}'
	}
	i = jsonSpace(b, i+1)
	if i < len(b) && b[i] == end {
		return i + 1, true
	}
	for {
		var ok bool
		if object {
			if i >= len(b) || b[i] != '"' {
				return i, false
			}
			if i, ok = jsonString(b, i); !ok {
				return i, false
			}
			if i = jsonSpace(b, i); i >= len(b) || b[i] != ':' {
				return i, false
			}
			i = jsonSpace(b, i+1)
		}
		if i, ok = jsonValue(b, i, depth); !ok {
			return i, false
		}
		switch i = jsonSpace(b, i); {
		case i >= len(b):
			return i, false
		case b[i] == ',':
			i = jsonSpace(b, i+1)
		case b[i] == end:
			return i + 1, true
		default:
			return i, false
		}
	}
}

// jsonPlain marks the bytes a string holds as they are: ASCII from 0x20 on, but for the
// quote and the backslash.
var jsonPlain = func() (t [256]bool) {
	for c := 0x20; c < utf8.RuneSelf; c++ {
		t[c] = c != '"' && c != '\\'
	}
	return t
}()

// jsonString checks the string whose opening quote is b[i].
func jsonString(b []byte, i int) (int, bool) {
	for i++; i < len(b); {
		for i < len(b) && jsonPlain[b[i]] {
			i++
		}
		if i >= len(b) {
			break
		}
		switch c := b[i]; {
		case c == '"':
			return i + 1, true
		case c == '\\':
			if i+1 >= len(b) {
				return i, false
			}
			switch b[i+1] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
				i += 2
			case 'u':
				if i+6 > len(b) || !isHex(b[i+2]) || !isHex(b[i+3]) || !isHex(b[i+4]) || !isHex(b[i+5]) {
					return i, false
				}
				i += 6
			default:
				return i, false
			}
		case c < utf8.RuneSelf: // a control character
			return i, false
		default:
			r, size := utf8.DecodeRune(b[i:])
			if r == utf8.RuneError && size == 1 {
				return i, false
			}
			i += size
		}
	}
	return i, false
}

// jsonNumber checks -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)? at b[i].
func jsonNumber(b []byte, i int) (int, bool) {
	if b[i] == '-' {
		i++
	}
	switch {
	case i >= len(b) || !isDigit(b[i]):
		return i, false
	case b[i] == '0':
		i++
	default:
		i = jsonDigits(b, i)
	}
	if i < len(b) && b[i] == '.' {
		j := jsonDigits(b, i+1)
		if j == i+1 {
			return j, false
		}
		i = j
	}
	if i < len(b) && (b[i] == 'e' || b[i] == 'E') {
		i++
		if i < len(b) && (b[i] == '+' || b[i] == '-') {
			i++
		}
		j := jsonDigits(b, i)
		if j == i {
			return j, false
		}
		i = j
	}
	return i, true
}

func jsonDigits(b []byte, i int) int {
	for i < len(b) && isDigit(b[i]) {
		i++
	}
	return i
}

func jsonLiteral(b []byte, i int, lit string) (int, bool) {
	if len(b)-i < len(lit) || string(b[i:i+len(lit)]) != lit {
		return i, false
	}
	return i + len(lit), true
}

func isDigit(c byte) bool { return '0' <= c && c <= '9' }

func isHex(c byte) bool { return isDigit(c) || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F' }
