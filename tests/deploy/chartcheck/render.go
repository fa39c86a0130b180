// Helm-compatible rendering of a chart directory with text/template + sprig: the subset of
// Helm 3's engine pdserve's chart uses, done the way Helm does it (see docs/deploy.md).
package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strings"
	"text/template"

	"github.com/Masterminds/sprig"
	"gopkg.in/yaml.v3"
)

// files is .Files: the chart's non-template files, by path relative to the chart root.
type files map[string][]byte

func (f files) Get(name string) string { return string(f[name]) }

func (f files) GetBytes(name string) []byte { return f[name] }

type capabilities struct {
	KubeVersion struct{ Version, Major, Minor, GitVersion string }
	APIVersions apiVersions
}

type apiVersions []string

func (a apiVersions) Has(v string) bool {
	for _, x := range a {
		if x == v {
			return true
		}
	}
	return false
}

// jsonNumbers converts what yaml.v3 decoded into what Helm's values hold: Helm reads values
// through sigs.k8s.io/yaml (YAML -> JSON -> interface{}), so every number is a float64 and
// every map a map[string]interface{}. This matters: a float64 4000000 prints as "4e+06".
func jsonNumbers(v interface{}) (interface{}, error) {
	data, err := json.Marshal(toStringKeys(v))
	if err != nil {
		return nil, err
	}
	var out interface{}
	if err := json.Unmarshal(data, &out); err != nil {
		return nil, err
	}
	return out, nil
}

func toStringKeys(v interface{}) interface{} {
	switch t := v.(type) {
	case map[string]interface{}:
		for k, x := range t {
			t[k] = toStringKeys(x)
		}
		return t
	case map[interface{}]interface{}:
		m := map[string]interface{}{}
		for k, x := range t {
			m[fmt.Sprint(k)] = toStringKeys(x)
		}
		return m
	case []interface{}:
		for i, x := range t {
			t[i] = toStringKeys(x)
		}
		return t
	}
	return v
}

func readValuesFile(file string) (map[string]interface{}, error) {
	data, err := os.ReadFile(file)
	if err != nil {
		return nil, err
	}
	var raw interface{}
	if err := yaml.Unmarshal(data, &raw); err != nil {
		return nil, fmt.Errorf("%s: %v", file, err)
	}
	if raw == nil {
		return map[string]interface{}{}, nil
	}
	conv, err := jsonNumbers(raw)
	if err != nil {
		return nil, fmt.Errorf("%s: %v", file, err)
	}
	m, ok := conv.(map[string]interface{})
	if !ok {
		return nil, fmt.Errorf("%s: top level is not a map", file)
	}
	return m, nil
}

// coalesce merges src over dst as Helm does for -f files: maps merge key by key, anything else
// replaces, and a null in src deletes the key.
func coalesce(dst, src map[string]interface{}) map[string]interface{} {
	for k, sv := range src {
		if sv == nil {
			delete(dst, k)
			continue
		}
		sm, sIsMap := sv.(map[string]interface{})
		dm, dIsMap := dst[k].(map[string]interface{})
		if sIsMap && dIsMap {
			dst[k] = coalesce(dm, sm)
		} else {
			dst[k] = sv
		}
	}
	return dst
}

type renderOptions struct {
	chartDir    string
	valuesFiles []string
	releaseName string
	namespace   string
}

// rendered is one template's output, keyed by Helm's template name (<chart>/templates/<file>).
type rendered struct {
	name string
	text string
}

type chartMeta struct {
	Name, Version, AppVersion, KubeVersion, APIVersion string
}

func loadChartMeta(dir string) (chartMeta, error) {
	var raw map[string]interface{}
	data, err := os.ReadFile(filepath.Join(dir, "Chart.yaml"))
	if err != nil {
		return chartMeta{}, err
	}
	if err := yaml.Unmarshal(data, &raw); err != nil {
		return chartMeta{}, fmt.Errorf("Chart.yaml: %v", err)
	}
	get := func(k string) string {
		if v, ok := raw[k]; ok && v != nil {
			return fmt.Sprint(v)
		}
		return ""
	}
	m := chartMeta{Name: get("name"), Version: get("version"), AppVersion: get("appVersion"),
		KubeVersion: get("kubeVersion"), APIVersion: get("apiVersion")}
	if m.Name == "" || m.Version == "" || m.APIVersion != "v2" {
		return m, errors.New("Chart.yaml: name, version and apiVersion v2 are required")
	}
	return m, nil
}

// funcMap: sprig's text functions without env/expandenv (Helm drops them) plus Helm's own.
func funcMap(t *template.Template, includedNames map[string]int) template.FuncMap {
	f := sprig.TxtFuncMap()
	delete(f, "env")
	delete(f, "expandenv")
	f["toYaml"] = func(v interface{}) string {
		var buf bytes.Buffer
		enc := yaml.NewEncoder(&buf)
		enc.SetIndent(2)
		if err := enc.Encode(v); err != nil {
			return ""
		}
		return strings.TrimSuffix(buf.String(), "\n")
	}
	f["fromYaml"] = func(s string) map[string]interface{} {
		var raw interface{}
		m := map[string]interface{}{}
		if err := yaml.Unmarshal([]byte(s), &raw); err != nil {
			m["Error"] = err.Error()
			return m
		}
		if conv, err := jsonNumbers(raw); err == nil {
			if mm, ok := conv.(map[string]interface{}); ok {
				return mm
			}
		}
		return m
	}
	f["toJson"] = func(v interface{}) string {
		data, err := json.Marshal(v)
		if err != nil {
			return ""
		}
		return string(data)
	}
	f["fromJson"] = func(s string) map[string]interface{} {
		m := map[string]interface{}{}
		if err := json.Unmarshal([]byte(s), &m); err != nil {
			m["Error"] = err.Error()
		}
		return m
	}
	f["required"] = func(msg string, v interface{}) (interface{}, error) {
		if v == nil {
			return v, errors.New(msg)
		}
		if s, ok := v.(string); ok && s == "" {
			return v, errors.New(msg)
		}
		return v, nil
	}
	f["fail"] = func(msg string) (string, error) { return "", errors.New(msg) }
	// No cluster here: lookup finds nothing, as in `helm template`.
	f["lookup"] = func(string, string, string, string) (map[string]interface{}, error) {
		return map[string]interface{}{}, nil
	}
	f["include"] = func(name string, data interface{}) (string, error) {
		// Helm bounds recursion the same way (1000 nested includes of one name).
		if includedNames[name] > 1000 {
			return "", fmt.Errorf("rendering template has a nested reference name: %s", name)
		}
		includedNames[name]++
		defer func() { includedNames[name]-- }()
		var buf bytes.Buffer
		if err := t.ExecuteTemplate(&buf, name, data); err != nil {
			return "", err
		}
		return buf.String(), nil
	}
	f["tpl"] = func(text string, data interface{}) (string, error) {
		clone, err := t.Clone()
		if err != nil {
			return "", err
		}
		inner, err := clone.New("tpl").Option("missingkey=zero").Parse(text)
		if err != nil {
			return "", fmt.Errorf("tpl: %v", err)
		}
		var buf bytes.Buffer
		if err := inner.Execute(&buf, data); err != nil {
			return "", err
		}
		return strings.ReplaceAll(buf.String(), "<no value>", ""), nil
	}
	return f
}

// renderChart renders every template (not partials "_*") and NOTES.txt, in name order.
func renderChart(o renderOptions) ([]rendered, map[string]interface{}, error) {
	meta, err := loadChartMeta(o.chartDir)
	if err != nil {
		return nil, nil, err
	}
	values, err := readValuesFile(filepath.Join(o.chartDir, "values.yaml"))
	if err != nil {
		return nil, nil, err
	}
	for _, vf := range o.valuesFiles {
		over, err := readValuesFile(vf)
		if err != nil {
			return nil, nil, err
		}
		values = coalesce(values, over)
	}
	if err := validateValuesSchema(o.chartDir, meta.Name, values); err != nil {
		return nil, nil, err
	}
	chartFiles := files{}
	var templates []string
	err = filepath.Walk(o.chartDir, func(p string, info os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		if info.IsDir() {
			return nil
		}
		rel, _ := filepath.Rel(o.chartDir, p)
		rel = filepath.ToSlash(rel)
		data, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		if strings.HasPrefix(rel, "templates/") {
			templates = append(templates, rel)
		} else {
			chartFiles[rel] = data
		}
		return nil
	})
	if err != nil {
		return nil, nil, err
	}
	sort.Strings(templates)

	caps := capabilities{APIVersions: apiVersions{"v1", "apps/v1", "policy/v1", "autoscaling/v2",
		"networking.k8s.io/v1", "monitoring.coreos.com/v1"}}
	caps.KubeVersion.Version = "v1.28.0"
	caps.KubeVersion.GitVersion = "v1.28.0"
	caps.KubeVersion.Major = "1"
	caps.KubeVersion.Minor = "28"

	root := template.New("gotpl")
	included := map[string]int{}
	root.Funcs(funcMap(root, included))
	// Helm: missingkey=zero, then "<no value>" is removed from the output.
	root.Option("missingkey=zero")
	basePath := path.Join(meta.Name, "templates")
	for _, rel := range templates {
		name := path.Join(meta.Name, rel)
		data, err := os.ReadFile(filepath.Join(o.chartDir, rel))
		if err != nil {
			return nil, nil, err
		}
		if _, err := root.New(name).Parse(string(data)); err != nil {
			return nil, nil, fmt.Errorf("parse error: %v", err)
		}
	}
	top := map[string]interface{}{
		"Values": values,
		"Release": map[string]interface{}{"Name": o.releaseName, "Namespace": o.namespace,
			"Service": "Helm", "IsInstall": true, "IsUpgrade": false, "Revision": 1},
		"Chart": map[string]interface{}{"Name": meta.Name, "Version": meta.Version,
			"AppVersion": meta.AppVersion, "KubeVersion": meta.KubeVersion},
		"Capabilities": caps,
		"Files":        chartFiles,
	}
	var out []rendered
	for _, rel := range templates {
		base := path.Base(rel)
		if strings.HasPrefix(base, "_") {
			continue
		}
		name := path.Join(meta.Name, rel)
		vals := map[string]interface{}{}
		for k, v := range top {
			vals[k] = v
		}
		vals["Template"] = map[string]interface{}{"Name": name, "BasePath": basePath}
		var buf bytes.Buffer
		if err := root.ExecuteTemplate(&buf, name, vals); err != nil {
			return nil, nil, fmt.Errorf("render error in %s: %v", name, err)
		}
		out = append(out, rendered{name: name, text: strings.ReplaceAll(buf.String(), "<no value>", "")})
	}
	return out, values, nil
}
