// Every value of values.yaml is documented in docs/deploy.md's table.
package main

import (
	"flag"
	"fmt"
	"os"
	"sort"
	"strings"
)

// Maps whose entries are free-form (flags mirror --help; Kubernetes objects): documented whole.
var opaqueValueMaps = map[string]bool{"flags": true, "resources": true, "labels": true,
	"annotations": true, "nodeSelector": true, "affinity": true, "securityContext": true,
	"podSecurityContext": true, "podLabels": true, "podAnnotations": true}

func valueLeaves(v map[string]interface{}, prefix string, out *[]string) {
	for k, x := range v {
		p := k
		if prefix != "" {
			p = prefix + "." + k
		}
		if mm, ok := x.(map[string]interface{}); ok && len(mm) > 0 && !opaqueValueMaps[k] {
			valueLeaves(mm, p, out)
			continue
		}
		*out = append(*out, p)
	}
}

func runValuesDoc(argv []string) int {
	fs := flag.NewFlagSet("values-doc", flag.ExitOnError)
	values := fs.String("values", "", "the chart's values.yaml")
	doc := fs.String("doc", "", "the document with the values table")
	_ = fs.Parse(argv)
	if *values == "" || *doc == "" {
		usage()
	}
	v, err := readValuesFile(*values)
	if err != nil {
		fmt.Printf("FAIL: values-doc: %v\n", err)
		return 1
	}
	text, err := os.ReadFile(*doc)
	if err != nil {
		fmt.Printf("FAIL: values-doc: %v\n", err)
		return 1
	}
	var leaves []string
	valueLeaves(v, "", &leaves)
	sort.Strings(leaves)
	failed := 0
	for _, leaf := range leaves {
		if !strings.Contains(string(text), "`"+leaf+"`") {
			fmt.Printf("FAIL: values-doc: value %s is not documented in %s (write `%s` in the table)\n", leaf, *doc, leaf)
			failed++
		}
	}
	if failed > 0 {
		return 1
	}
	fmt.Printf("OK: values-doc: all %d values of %s are in %s\n", len(leaves), *values, *doc)
	return 0
}
