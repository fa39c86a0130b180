// chartcheck: checks the pdserve Helm chart and container files without a cluster, a helm
// binary or a Docker engine (docs/deploy.md, "The chart check").
//
//	chartcheck chart --chart DIR [--values FILE]... --bin NAME=PATH... [--allow-missing-bin NAME]
//	                 [--pending-flag BIN:FLAG] [--assume-exists Kind/name] [--out FILE]
//	                 [--images FILE [--external-image REPOSITORY]...] [--expect-secure]
//	chartcheck docker --dir deploy/docker --setup scripts/setup.sh --build-dir BUILD
//	chartcheck dashboard --file helm/pdserve/dashboards/pdserve.json --src services
//	chartcheck values-doc --values helm/pdserve/values.yaml --doc docs/deploy.md
//
// Exit status: 0 all checks passed, 1 a check failed (one "FAIL:" line per problem), 2 usage.
package main

import (
	"flag"
	"fmt"
	"os"
	"strings"
)

type listFlag []string

func (l *listFlag) String() string     { return strings.Join(*l, ",") }
func (l *listFlag) Set(v string) error { *l = append(*l, v); return nil }

func usage() {
	fmt.Fprintln(os.Stderr, "usage: chartcheck chart|docker [flags] (see the header of main.go)")
	os.Exit(2)
}

func main() {
	if len(os.Args) < 2 {
		usage()
	}
	switch os.Args[1] {
	case "chart":
		os.Exit(runChart(os.Args[2:]))
	case "values-doc":
		os.Exit(runValuesDoc(os.Args[2:]))
	case "dashboard":
		os.Exit(runDashboard(os.Args[2:]))
	case "docker":
		os.Exit(runDocker(os.Args[2:]))
	default:
		usage()
	}
}

func runChart(argv []string) int {
	fs := flag.NewFlagSet("chart", flag.ExitOnError)
	chartDir := fs.String("chart", "", "chart directory")
	out := fs.String("out", "", "write the rendered manifests here")
	release := fs.String("release", "pdserve", "release name")
	namespace := fs.String("namespace", "pdserve", "release namespace")
	expectSecure := fs.Bool("expect-secure", false, "the values select secure mode: check every binary's TLS, token, API-key and Redis password flags and their Secret mounts")
	imagesFile := fs.String("images", "", "`scripts/images.sh --list` output: every image the chart names must be one of them")
	var values, bins, allowMissing, pending, assumed, external listFlag
	fs.Var(&external, "external-image", "repository of an image that scripts/images.sh does not build (third party)")
	fs.Var(&values, "values", "values file (repeatable, merged in order over values.yaml)")
	fs.Var(&bins, "bin", "NAME=PATH of a binary whose --help gives the flags (repeatable)")
	fs.Var(&allowMissing, "allow-missing-bin", "binary that may be unbuilt: its flags are NOT checked")
	fs.Var(&pending, "pending-flag", "BIN:FLAG allowed although --help lacks it (not landed yet)")
	fs.Var(&assumed, "assume-exists", "Kind/name that exists outside the chart")
	_ = fs.Parse(argv)
	if *chartDir == "" {
		usage()
	}
	label := "values.yaml"
	if len(values) > 0 {
		label = strings.Join(values, " + ")
	}
	c := &checker{bins: map[string]map[string]flagInfo{}, skipBins: map[string]bool{},
		pending: map[string]bool{}, assumed: map[string]bool{}, usedPend: map[string]bool{},
		expectSecure: *expectSecure}
	for _, p := range pending {
		c.pending[p] = true
	}
	for _, a := range assumed {
		c.assumed[a] = true
	}
	if *imagesFile != "" {
		built, err := readImageList(*imagesFile)
		if err != nil {
			fmt.Printf("FAIL: %s: %v\n", label, err)
			return 1
		}
		c.builtImages = built
		c.externalRepos = map[string]bool{}
		for _, r := range external {
			c.externalRepos[r] = true
		}
	}
	missingOK := map[string]bool{}
	for _, b := range allowMissing {
		missingOK[b] = true
	}
	for _, b := range bins {
		name, p, ok := strings.Cut(b, "=")
		if !ok {
			usage()
		}
		if _, err := os.Stat(p); err != nil {
			if missingOK[name] {
				fmt.Printf("SKIPPED: %s is not built (%s): its flags in the chart are NOT checked\n", name, p)
				c.skipBins[name] = true
				continue
			}
			fmt.Printf("FAIL: %s: %s is missing; build it first\n", label, p)
			return 1
		}
		flags, err := readBinaryFlags(p)
		if err != nil {
			fmt.Printf("FAIL: %s: %v\n", label, err)
			return 1
		}
		c.bins[name] = flags
	}
	opts := renderOptions{chartDir: *chartDir, valuesFiles: values, releaseName: *release,
		namespace: *namespace}
	docs, _, err := renderChart(opts)
	if err != nil {
		fmt.Printf("FAIL: %s: %v\n", label, err)
		return 1
	}
	// Render-stable: `helm template` and Argo CD render the chart again and again, with no
	// cluster to look anything up in; anything generated at render time (randAlphaNum, lookup,
	// now, genCA) would change on every render and roll or break the release.
	again, _, err := renderChart(opts)
	if err != nil {
		fmt.Printf("FAIL: %s: second render: %v\n", label, err)
		return 1
	}
	for i := range docs {
		if i < len(again) && docs[i].text != again[i].text {
			fmt.Printf("FAIL: %s: two renders of %s differ: a value is generated at render time (randAlphaNum, lookup, now, gen*): helm template and Argo CD would change it on every render\n", label, docs[i].name)
			return 1
		}
	}
	if *out != "" {
		var b strings.Builder
		for _, d := range docs {
			fmt.Fprintf(&b, "---\n# Source: %s\n%s\n", d.name, d.text)
		}
		if err := os.WriteFile(*out, []byte(b.String()), 0o644); err != nil {
			fmt.Printf("FAIL: %v\n", err)
			return 1
		}
	}
	c.load(docs)
	c.run()
	for p := range c.pending {
		bin := strings.SplitN(p, ":", 2)[0]
		if !c.usedPend[p] && !c.skipBins[bin] && c.bins[bin] != nil {
			fmt.Printf("note: --pending-flag %s was not needed by this values file\n", p)
		}
	}
	for _, n := range c.notes {
		fmt.Printf("note: %s\n", n)
	}
	kinds := map[string]int{}
	for _, o := range c.objects {
		kinds[o.kind]++
	}
	if len(c.errors) > 0 {
		for _, e := range c.errors {
			fmt.Printf("FAIL: %s: %s\n", label, e)
		}
		return 1
	}
	images := ""
	if c.builtImages != nil {
		images = ", images are scripts/images.sh's"
	}
	fmt.Printf("OK: %s: %d objects %v, all references resolve, flags match --help%s\n", label, len(c.objects), kinds, images)
	return 0
}
