// The Grafana dashboard queries only metrics the binaries really export.
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
)

var metricName = regexp.MustCompile(`\bpd_[a-z0-9_]+`)

func collectExprs(v interface{}, out *[]string) {
	switch t := v.(type) {
	case map[string]interface{}:
		for k, x := range t {
			if k == "expr" || k == "definition" {
				if s, ok := x.(string); ok {
					*out = append(*out, s)
				}
			}
			collectExprs(x, out)
		}
	case []interface{}:
		for _, x := range t {
			collectExprs(x, out)
		}
	}
}

func runDashboard(argv []string) int {
	fs := flag.NewFlagSet("dashboard", flag.ExitOnError)
	file := fs.String("file", "", "dashboard JSON")
	var srcs listFlag
	fs.Var(&srcs, "src", "source folder whose .cc files register the metrics (repeatable)")
	_ = fs.Parse(argv)
	if *file == "" || len(srcs) == 0 {
		usage()
	}
	data, err := os.ReadFile(*file)
	if err != nil {
		fmt.Printf("FAIL: dashboard: %v\n", err)
		return 1
	}
	var dash interface{}
	if err := json.Unmarshal(data, &dash); err != nil {
		fmt.Printf("FAIL: dashboard: %s is not JSON: %v\n", *file, err)
		return 1
	}
	var sources strings.Builder
	for _, dir := range srcs {
		_ = filepath.Walk(dir, func(p string, info os.FileInfo, err error) error {
			if err == nil && !info.IsDir() && strings.HasSuffix(p, ".cc") && !strings.HasSuffix(p, "_test.cc") {
				if b, err := os.ReadFile(p); err == nil {
					sources.Write(b)
				}
			}
			return nil
		})
	}
	var exprs []string
	collectExprs(dash, &exprs)
	names := map[string]bool{}
	for _, e := range exprs {
		for _, n := range metricName.FindAllString(e, -1) {
			names[n] = true
		}
	}
	var fails []string
	for n := range names {
		base := n
		for _, suffix := range []string{"_bucket", "_sum", "_count"} {
			if strings.HasSuffix(n, suffix) && !strings.Contains(sources.String(), `"`+n+`"`) {
				base = strings.TrimSuffix(n, suffix)
			}
		}
		if !strings.Contains(sources.String(), `"`+base+`"`) {
			fails = append(fails, fmt.Sprintf("FAIL: dashboard: metric %s is not registered by any binary (no \"%s\" in %v)", n, base, []string(srcs)))
		}
	}
	sort.Strings(fails)
	if len(exprs) == 0 {
		fails = append(fails, "FAIL: dashboard: no queries")
	}
	for _, f := range fails {
		fmt.Println(f)
	}
	if len(fails) > 0 {
		return 1
	}
	fmt.Printf("OK: dashboard: %d queries over %d metric names, all registered by the binaries\n", len(exprs), len(names))
	return 0
}
