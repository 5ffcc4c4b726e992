package outbox

import (
	"encoding/json"
	"strings"
	"testing"
	"unicode/utf8"
)

// jsonCases are inputs on both sides of every rule validJSON implements.
var jsonCases = []string{
	``, ` `, `{}`, ` {} `, `[]`, `[ ]`, `{ }`, `null`, `true`, `false`, `nul`, `nulll`, `True`,
	`0`, `-0`, `01`, `-01`, `1.5`, `1.`, `.5`, `1e5`, `1E+5`, `1e-5`, `1e`, `1e+`, `-`, `--1`, `+1`,
	`12345678901234567890.000`, `1.5e300`, `0.0e0`, `[1,2]`, `[1,]`, `[,1]`, `[1 2]`, `{"a":1}`,
	`{"a":1,}`, `{"a" 1}`, `{a:1}`, `{"a":1 "b":2}`, `{"a":{"b":[true,false,null]}}`, `{"a":}`,
	`"x"`, `"`, `"\"`, `"\\"`, `"\/"`, `"\b\f\n\r\t"`, `"\x"`, `"\u00e9"`, `"\u00E9"`, `"\u00g9"`,
	`"\u00e"`, `"\ud800"`, `"\udc00\ud800"`, "\"tab\there\"", "\"nl\nhere\"", "\"\x7f\"",
	`"Grüße, 世界 🚀"`, "\"\xff\"", "\"\xc3\"", "\"\xed\xa0\x80\"", "\"\xef\xbf\xbd\"", "\xef\xbb\xbf{}",
	"{}\x00", "\t\r\n[1]\n", `[1]]`, `[[1]`, `{}{}`, `1 2`, "\"a\x00b\"",
	`{"z": 1,   "a": [1, 2.50, 1e3], "nested": {"b": null, "a": true} }`,
}

func TestValidJSON(t *testing.T) {
	for _, c := range jsonCases {
		want := utf8.ValidString(c) && json.Valid([]byte(c))
		if got := validJSON([]byte(c)); got != want {
			t.Errorf("validJSON(%q) = %v, want %v", c, got, want)
		}
	}
}

// TestValidJSONDepth checks encoding/json's nesting limit on both sides.
func TestValidJSONDepth(t *testing.T) {
	for _, open := range []string{"[", `{"a":`} {
		closer := map[string]string{"[": "]", `{"a":`: "}"}[open]
		for _, depth := range []int{jsonMaxDepth, jsonMaxDepth + 1} {
			doc := []byte(strings.Repeat(open, depth) + "1" + strings.Repeat(closer, depth))
			if got, want := validJSON(doc), json.Valid(doc); got != want {
				t.Errorf("depth %d of %q: validJSON = %v, json.Valid = %v", depth, open, got, want)
			}
		}
	}
	if !validJSON([]byte(strings.Repeat("[", jsonMaxDepth) + strings.Repeat("]", jsonMaxDepth))) {
		t.Error("the deepest nesting encoding/json accepts must be valid")
	}
}

// FuzzValidJSON holds validJSON to its definition: utf8.Valid && json.Valid.
func FuzzValidJSON(f *testing.F) {
	for _, c := range jsonCases {
		f.Add([]byte(c))
	}
	f.Add([]byte(benchPayload))
	f.Fuzz(func(t *testing.T, b []byte) {
		want := utf8.Valid(b) && json.Valid(b)
		if got := validJSON(b); got != want {
			t.Fatalf("validJSON(%q) = %v, want %v", b, got, want)
		}
	})
}

// BenchmarkValidJSON compares validJSON with the checks it replaces on a typical payload.
func BenchmarkValidJSON(b *testing.B) {
	b.Run("validJSON", func(b *testing.B) {
		b.SetBytes(int64(len(benchPayload)))
		for b.Loop() {
			if !validJSON(benchPayload) {
				b.Fatal("invalid")
			}
		}
	})
	b.Run("utf8.Valid+json.Valid", func(b *testing.B) {
		b.SetBytes(int64(len(benchPayload)))
		for b.Loop() {
			if !utf8.Valid(benchPayload) || !json.Valid(benchPayload) {
				b.Fatal("invalid")
			}
		}
	})
}
