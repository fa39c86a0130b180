// Validation of rendered manifests: schema basics per kind and every cross-object reference.
package main

import (
	"encoding/base64"
	"fmt"
	"math/big"
	"os"
	"path"
	"regexp"
	"sort"
	"strconv"
	"strings"

	"gopkg.in/yaml.v3"
)

type object struct {
	source     string // template it came from
	apiVersion string
	kind       string
	name       string
	body       map[string]interface{}
}

func (o *object) id() string { return o.kind + "/" + o.name }

type checker struct {
	objects  []*object
	byID     map[string]*object
	errors   []string
	notes    []string
	bins     map[string]map[string]flagInfo // binary base name -> flags
	skipBins map[string]bool                // binaries not built: flags not checked
	pending  map[string]bool                // "pd-worker:tierd_address": allowed while unbuilt
	assumed  map[string]bool                // Kind/name that exist outside the chart
	usedPend map[string]bool
	// builtImages: image -> the scripts/images.sh entry building it (nil: not checked);
	// externalRepos: third-party repositories the chart may name besides them.
	builtImages   map[string]string
	externalRepos map[string]bool
	// expectSecure: the values ask for secure mode; its flags and Secret mounts are checked.
	expectSecure bool
}

var kindAPI = map[string]string{
	"Deployment": "apps/v1", "StatefulSet": "apps/v1", "DaemonSet": "apps/v1",
	"Service": "v1", "ConfigMap": "v1", "Secret": "v1", "ServiceAccount": "v1",
	"PodDisruptionBudget": "policy/v1", "HorizontalPodAutoscaler": "autoscaling/v2",
	"NetworkPolicy": "networking.k8s.io/v1", "ServiceMonitor": "monitoring.coreos.com/v1",
}

var (
	dns1123Label     = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`)
	dns1123Subdomain = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$`)
	envRef           = regexp.MustCompile(`\$\(([A-Za-z_][A-Za-z0-9_]*)\)`)
	quantityRe       = regexp.MustCompile(`^[0-9]+(\.[0-9]+)?(m|k|M|G|T|P|E|Ki|Mi|Gi|Ti|Pi|Ei)?$`)
)

func (c *checker) errorf(o *object, format string, args ...interface{}) {
	prefix := ""
	if o != nil {
		prefix = fmt.Sprintf("%s (%s): ", o.id(), o.source)
	}
	c.errors = append(c.errors, prefix+fmt.Sprintf(format, args...))
}

// --- generic access to decoded YAML ---

func m(v interface{}) map[string]interface{} {
	if x, ok := v.(map[string]interface{}); ok {
		return x
	}
	return nil
}

func l(v interface{}) []interface{} {
	if x, ok := v.([]interface{}); ok {
		return x
	}
	return nil
}

func s(v interface{}) string {
	switch x := v.(type) {
	case string:
		return x
	case nil:
		return ""
	}
	return fmt.Sprint(v)
}

func get(v interface{}, keys ...string) interface{} {
	for _, k := range keys {
		mm := m(v)
		if mm == nil {
			return nil
		}
		v = mm[k]
	}
	return v
}

func isInt(v interface{}) (int, bool) {
	switch x := v.(type) {
	case int:
		return x, true
	case float64:
		if x == float64(int(x)) {
			return int(x), true
		}
	}
	return 0, false
}

func stringMap(v interface{}) map[string]string {
	out := map[string]string{}
	for k, x := range m(v) {
		out[k] = s(x)
	}
	return out
}

func selects(selector, labels map[string]string) bool {
	if len(selector) == 0 {
		return false
	}
	for k, v := range selector {
		if labels[k] != v {
			return false
		}
	}
	return true
}

// --- parsing ---

func (c *checker) load(docs []rendered) {
	c.byID = map[string]*object{}
	for _, r := range docs {
		if path.Base(r.name) == "NOTES.txt" {
			continue
		}
		dec := yaml.NewDecoder(strings.NewReader(r.text))
		for i := 0; ; i++ {
			var raw interface{}
			err := dec.Decode(&raw)
			if err != nil {
				if err.Error() == "EOF" {
					break
				}
				c.errorf(nil, "%s: document %d does not parse as YAML: %v", r.name, i, err)
				break
			}
			if raw == nil {
				continue
			}
			conv, err := jsonNumbers(raw)
			body := m(conv)
			if err != nil || body == nil {
				c.errorf(nil, "%s: document %d is not a YAML map", r.name, i)
				continue
			}
			o := &object{source: r.name, apiVersion: s(body["apiVersion"]), kind: s(body["kind"]),
				name: s(get(body, "metadata", "name")), body: body}
			if o.apiVersion == "" || o.kind == "" || o.name == "" {
				c.errorf(nil, "%s: document %d lacks apiVersion, kind or metadata.name", r.name, i)
				continue
			}
			if want, ok := kindAPI[o.kind]; !ok {
				c.errorf(o, "kind %s is not one the check knows", o.kind)
			} else if want != o.apiVersion {
				c.errorf(o, "apiVersion %s, want %s", o.apiVersion, want)
			}
			if !dns1123Subdomain.MatchString(o.name) || len(o.name) > 253 {
				c.errorf(o, "metadata.name %q is not a DNS-1123 subdomain", o.name)
			}
			if (o.kind == "Service" || o.kind == "StatefulSet" || o.kind == "DaemonSet" ||
				o.kind == "Deployment") && (len(o.name) > 63 || !dns1123Label.MatchString(o.name)) {
				c.errorf(o, "name %q must be a DNS-1123 label of at most 63 characters", o.name)
			}
			if ns := s(get(body, "metadata", "namespace")); ns != "" {
				c.errorf(o, "metadata.namespace is set (%s); the chart installs into the release namespace", ns)
			}
			for k, v := range stringMap(get(body, "metadata", "labels")) {
				if len(v) > 63 {
					c.errorf(o, "label %s value longer than 63 characters", k)
				}
			}
			if _, dup := c.byID[o.id()]; dup {
				c.errorf(o, "defined twice")
				continue
			}
			c.byID[o.id()] = o
			c.objects = append(c.objects, o)
		}
	}
}

func (c *checker) exists(kind, name string) bool {
	if _, ok := c.byID[kind+"/"+name]; ok {
		return true
	}
	return c.assumed[kind+"/"+name]
}

// --- workloads ---

type pod struct {
	owner  *object
	labels map[string]string
	spec   map[string]interface{}
}

func (c *checker) pods() []pod {
	var out []pod
	for _, o := range c.objects {
		switch o.kind {
		case "Deployment", "StatefulSet", "DaemonSet":
			t := get(o.body, "spec", "template")
			out = append(out, pod{owner: o, labels: stringMap(get(t, "metadata", "labels")), spec: m(get(t, "spec"))})
		}
	}
	return out
}

func (c *checker) podsSelectedBy(selector map[string]string) []pod {
	var out []pod
	for _, p := range c.pods() {
		if selects(selector, p.labels) {
			out = append(out, p)
		}
	}
	return out
}

func containers(spec map[string]interface{}) []map[string]interface{} {
	var out []map[string]interface{}
	for _, x := range l(spec["initContainers"]) {
		out = append(out, m(x))
	}
	for _, x := range l(spec["containers"]) {
		out = append(out, m(x))
	}
	return out
}

// containerPort finds a port of a container by name or number.
func containerHasPort(ct map[string]interface{}, port interface{}) bool {
	for _, p := range l(ct["ports"]) {
		if n, ok := isInt(port); ok {
			if cp, ok2 := isInt(get(p, "containerPort")); ok2 && cp == n {
				return true
			}
		} else if s(get(p, "name")) == s(port) {
			return true
		}
	}
	return false
}

func podHasPort(spec map[string]interface{}, port interface{}) bool {
	for _, ct := range containers(spec) {
		if containerHasPort(ct, port) {
			return true
		}
	}
	return false
}

func (c *checker) checkWorkload(o *object) {
	spec := m(o.body["spec"])
	if spec == nil {
		c.errorf(o, "no spec")
		return
	}
	sel := stringMap(get(spec, "selector", "matchLabels"))
	if len(sel) == 0 {
		c.errorf(o, "spec.selector.matchLabels is empty")
	}
	tmpl := m(spec["template"])
	labels := stringMap(get(tmpl, "metadata", "labels"))
	if !selects(sel, labels) {
		c.errorf(o, "spec.selector does not match the pod template's labels")
	}
	if o.kind != "DaemonSet" {
		if r, ok := spec["replicas"]; ok {
			if n, ok := isInt(r); !ok || n < 0 {
				c.errorf(o, "spec.replicas %v is not a non-negative integer", r)
			}
		}
	}
	claimTemplates := map[string]bool{}
	if o.kind == "StatefulSet" {
		svc := s(spec["serviceName"])
		if svc == "" {
			c.errorf(o, "spec.serviceName is required")
		} else if !c.exists("Service", svc) {
			c.errorf(o, "spec.serviceName %q: no such Service", svc)
		}
		for _, vct := range l(spec["volumeClaimTemplates"]) {
			claimTemplates[s(get(vct, "metadata", "name"))] = true
			if q := s(get(vct, "spec", "resources", "requests", "storage")); !quantityRe.MatchString(q) {
				c.errorf(o, "volumeClaimTemplate %s: storage request %q is not a quantity", s(get(vct, "metadata", "name")), q)
			}
		}
	}
	c.checkPodSpec(o, m(tmpl["spec"]), claimTemplates)
}

func (c *checker) checkPodSpec(o *object, spec map[string]interface{}, claimTemplates map[string]bool) {
	if spec == nil {
		c.errorf(o, "pod template has no spec")
		return
	}
	if sa := s(spec["serviceAccountName"]); sa != "" && sa != "default" && !c.exists("ServiceAccount", sa) {
		c.errorf(o, "serviceAccountName %q: no such ServiceAccount", sa)
	}
	volumes := map[string]map[string]interface{}{}
	for _, v := range l(spec["volumes"]) {
		vm := m(v)
		name := s(vm["name"])
		if _, dup := volumes[name]; dup {
			c.errorf(o, "volume %q defined twice", name)
		}
		volumes[name] = vm
		c.checkVolume(o, vm)
	}
	cts := l(spec["containers"])
	if len(cts) == 0 {
		c.errorf(o, "pod template has no containers")
	}
	for _, x := range containers(spec) {
		c.checkContainer(o, x, volumes, claimTemplates)
		c.checkArgsJoined(o, x)
	}
	c.checkPodSecurity(o, spec)
}

func (c *checker) checkVolume(o *object, v map[string]interface{}) {
	name := s(v["name"])
	switch {
	case v["configMap"] != nil:
		cm := s(get(v, "configMap", "name"))
		obj := c.byID["ConfigMap/"+cm]
		if obj == nil {
			if !c.assumed["ConfigMap/"+cm] {
				c.errorf(o, "volume %s: ConfigMap %q does not exist", name, cm)
			}
			return
		}
		for _, it := range l(get(v, "configMap", "items")) {
			if _, ok := m(obj.body["data"])[s(get(it, "key"))]; !ok {
				c.errorf(o, "volume %s: ConfigMap %s has no key %q", name, cm, s(get(it, "key")))
			}
		}
	case v["secret"] != nil:
		sec := s(get(v, "secret", "secretName"))
		obj := c.byID["Secret/"+sec]
		if obj == nil {
			if !c.assumed["Secret/"+sec] {
				c.errorf(o, "volume %s: Secret %q does not exist", name, sec)
			}
			return
		}
		for _, it := range l(get(v, "secret", "items")) {
			if !secretHasKey(obj, s(get(it, "key"))) {
				c.errorf(o, "volume %s: Secret %s has no key %q", name, sec, s(get(it, "key")))
			}
		}
	case v["persistentVolumeClaim"] != nil:
		claim := s(get(v, "persistentVolumeClaim", "claimName"))
		if claim == "" {
			c.errorf(o, "volume %s: persistentVolumeClaim without claimName", name)
		} else if !c.exists("PersistentVolumeClaim", claim) {
			c.notes = append(c.notes, fmt.Sprintf("%s volume %s uses PersistentVolumeClaim %q, which must exist in the namespace (not checked)", o.id(), name, claim))
		}
	case v["hostPath"] != nil:
		if p := s(get(v, "hostPath", "path")); !strings.HasPrefix(p, "/") {
			c.errorf(o, "volume %s: hostPath.path %q is not absolute", name, p)
		}
	case v["emptyDir"] != nil:
	case v["ephemeral"] != nil:
		spec := get(v, "ephemeral", "volumeClaimTemplate", "spec")
		if q := s(get(spec, "resources", "requests", "storage")); !quantityRe.MatchString(q) {
			c.errorf(o, "volume %s: ephemeral storage request %q is not a quantity", name, q)
		}
		if len(l(get(spec, "accessModes"))) == 0 {
			c.errorf(o, "volume %s: ephemeral volumeClaimTemplate has no accessModes", name)
		}
	default:
		c.errorf(o, "volume %s: no known source", name)
	}
}

func secretHasKey(sec *object, key string) bool {
	if _, ok := m(sec.body["data"])[key]; ok {
		return true
	}
	_, ok := m(sec.body["stringData"])[key]
	return ok
}

func (c *checker) checkContainer(o *object, ct map[string]interface{}, volumes map[string]map[string]interface{}, claimTemplates map[string]bool) {
	name := s(ct["name"])
	where := fmt.Sprintf("container %s: ", name)
	if !dns1123Label.MatchString(name) {
		c.errorf(o, "%sname is not a DNS-1123 label", where)
	}
	image := s(ct["image"])
	if image == "" {
		c.errorf(o, "%sno image", where)
	} else if msg := imagePinProblem(image); msg != "" {
		c.errorf(o, "%simage %s: %s", where, image, msg)
	} else if msg := c.imageBuildProblem(image); msg != "" {
		c.errorf(o, "%simage %s %s", where, image, msg)
	}
	// Ports.
	portNames := map[string]bool{}
	for _, p := range l(ct["ports"]) {
		pn := s(get(p, "name"))
		if pn != "" {
			if len(pn) > 15 || !dns1123Label.MatchString(pn) {
				c.errorf(o, "%sport name %q is not an IANA service name (<= 15 chars)", where, pn)
			}
			if portNames[pn] {
				c.errorf(o, "%sport name %q twice", where, pn)
			}
			portNames[pn] = true
		}
		if n, ok := isInt(get(p, "containerPort")); !ok || n < 1 || n > 65535 {
			c.errorf(o, "%scontainerPort %v is not in 1..65535", where, get(p, "containerPort"))
		}
	}
	// Env.
	env := map[string]bool{}
	for _, e := range l(ct["env"]) {
		en := s(get(e, "name"))
		env[en] = true
		if ref := m(get(e, "valueFrom", "configMapKeyRef")); ref != nil {
			cm := c.byID["ConfigMap/"+s(ref["name"])]
			if cm == nil && !c.assumed["ConfigMap/"+s(ref["name"])] {
				c.errorf(o, "%senv %s: ConfigMap %q does not exist", where, en, s(ref["name"]))
			} else if cm != nil {
				if _, ok := m(cm.body["data"])[s(ref["key"])]; !ok {
					c.errorf(o, "%senv %s: ConfigMap %s has no key %q", where, en, s(ref["name"]), s(ref["key"]))
				}
			}
		}
		if ref := m(get(e, "valueFrom", "secretKeyRef")); ref != nil {
			sec := c.byID["Secret/"+s(ref["name"])]
			if sec == nil && !c.assumed["Secret/"+s(ref["name"])] {
				c.errorf(o, "%senv %s: Secret %q does not exist", where, en, s(ref["name"]))
			} else if sec != nil && !secretHasKey(sec, s(ref["key"])) {
				c.errorf(o, "%senv %s: Secret %s has no key %q", where, en, s(ref["name"]), s(ref["key"]))
			}
		}
		if fp := s(get(e, "valueFrom", "fieldRef", "fieldPath")); fp != "" {
			switch fp {
			case "metadata.name", "metadata.namespace", "metadata.uid", "spec.nodeName",
				"spec.serviceAccountName", "status.hostIP", "status.podIP", "status.podIPs":
			default:
				c.errorf(o, "%senv %s: fieldPath %q is not one the downward API offers", where, en, fp)
			}
		}
	}
	// Mounts.
	mounts := map[string]string{} // mountPath -> volume name
	for _, vm := range l(ct["volumeMounts"]) {
		vn := s(get(vm, "name"))
		if _, ok := volumes[vn]; !ok && !claimTemplates[vn] {
			c.errorf(o, "%svolumeMount %q: no such volume in the pod", where, vn)
		}
		mp := s(get(vm, "mountPath"))
		if _, dup := mounts[mp]; dup {
			c.errorf(o, "%stwo volumes mounted at %s", where, mp)
		}
		mounts[mp] = vn
	}
	// Probes.
	for _, probe := range []string{"readinessProbe", "livenessProbe", "startupProbe"} {
		p := m(ct[probe])
		if p == nil {
			continue
		}
		switch {
		case p["grpc"] != nil:
			port := get(p, "grpc", "port")
			if _, ok := isInt(port); !ok {
				c.errorf(o, "%s%s: grpc.port must be a number, got %v", where, probe, port)
			} else if !containerHasPort(ct, port) {
				c.errorf(o, "%s%s: grpc port %v is not a containerPort", where, probe, port)
			}
		case p["httpGet"] != nil:
			if !containerHasPort(ct, get(p, "httpGet", "port")) {
				c.errorf(o, "%s%s: httpGet port %v is not a port of the container", where, probe, get(p, "httpGet", "port"))
			}
		case p["tcpSocket"] != nil:
			if !containerHasPort(ct, get(p, "tcpSocket", "port")) {
				c.errorf(o, "%s%s: tcpSocket port %v is not a port of the container", where, probe, get(p, "tcpSocket", "port"))
			}
		case p["exec"] != nil:
			if len(l(get(p, "exec", "command"))) == 0 {
				c.errorf(o, "%s%s: exec without command", where, probe)
			}
		default:
			c.errorf(o, "%s%s: no handler (grpc, httpGet, tcpSocket, exec)", where, probe)
		}
	}
	// Resources.
	for _, section := range []string{"requests", "limits"} {
		for k, v := range m(get(ct, "resources", section)) {
			if !quantityRe.MatchString(s(v)) {
				c.errorf(o, "%sresources.%s.%s %q is not a quantity", where, section, k, s(v))
			}
		}
	}
	if g, ok := m(get(ct, "resources", "requests"))["nvidia.com/gpu"]; ok {
		if s(m(get(ct, "resources", "limits"))["nvidia.com/gpu"]) != s(g) {
			c.errorf(o, "%snvidia.com/gpu requests must equal its limits", where)
		}
	}
	// Args: $(VAR) references and the binary's flags.
	var args []string
	for _, a := range append(l(ct["command"]), l(ct["args"])...) {
		args = append(args, s(a))
	}
	for _, a := range args {
		for _, ref := range envRef.FindAllStringSubmatch(a, -1) {
			if !env[ref[1]] {
				c.errorf(o, "%sargument %q uses $(%s), which is not in the container's env", where, a, ref[1])
			}
		}
	}
	if cmd := l(ct["command"]); len(cmd) > 0 {
		bin := path.Base(s(cmd[0]))
		if strings.HasPrefix(bin, "pd-") {
			c.checkFlags(o, ct, where, bin, args[1:], mounts, volumes)
		}
	}
}

// imageBuildProblem: with --images, every image is one scripts/images.sh builds (same
// repository and tag) or comes from a repository declared external.
func (c *checker) imageBuildProblem(image string) string {
	if c.builtImages == nil {
		return ""
	}
	if _, ok := c.builtImages[image]; ok {
		return ""
	}
	repo := image
	if i := strings.LastIndex(image, ":"); i > strings.LastIndex(image, "/") {
		repo = image[:i]
	}
	if c.externalRepos[repo] {
		return ""
	}
	var names []string
	for im := range c.builtImages {
		names = append(names, im)
	}
	sort.Strings(names)
	return fmt.Sprintf("is not built by scripts/images.sh (it builds %s); fix image.repository/image.tag or the script's image list",
		strings.Join(names, ", "))
}

// readImageList: `scripts/images.sh --list` lines, "NAME IMAGE DOCKERFILE".
func readImageList(file string) (map[string]string, error) {
	data, err := os.ReadFile(file)
	if err != nil {
		return nil, err
	}
	images := map[string]string{}
	for _, line := range strings.Split(string(data), "\n") {
		f := strings.Fields(line)
		if len(f) == 0 {
			continue
		}
		if len(f) != 3 {
			return nil, fmt.Errorf("%s: want \"NAME IMAGE DOCKERFILE\", got %q", file, line)
		}
		images[f[1]] = f[0]
	}
	if len(images) == 0 {
		return nil, fmt.Errorf("%s: no images (scripts/images.sh --list printed nothing)", file)
	}
	return images, nil
}

// imagePinProblem: images carry an explicit tag that is not "latest" (or a digest).
func imagePinProblem(image string) string {
	if strings.Contains(image, "@sha256:") {
		return ""
	}
	last := image[strings.LastIndex(image, "/")+1:]
	i := strings.LastIndex(last, ":")
	if i < 0 {
		return "no tag (pin a version)"
	}
	tag := last[i+1:]
	if tag == "" || tag == "latest" {
		return "tag \"" + tag + "\" is not a pinned version"
	}
	return ""
}

type flagUse struct {
	name, value, origin string
}

func (c *checker) checkFlags(o *object, ct map[string]interface{}, where, bin string, args []string, mounts map[string]string, volumes map[string]map[string]interface{}) {
	var uses []flagUse
	for i := 0; i < len(args); i++ {
		a := args[i]
		if !strings.HasPrefix(a, "--") {
			c.errorf(o, "%sargument %q of %s is not a --flag=value (positional arguments are not used)", where, a, bin)
			continue
		}
		name, value, hasValue := strings.Cut(a[2:], "=")
		if !hasValue {
			c.errorf(o, "%sflag --%s of %s has no '=value' (write --%s=VALUE: a separate value is ambiguous for booleans)", where, name, bin, name)
			continue
		}
		uses = append(uses, flagUse{name, value, "args"})
		if name == "flagfile" {
			lines, err := c.resolveFlagfile(value, mounts, volumes)
			if err != nil {
				c.errorf(o, "%s--flagfile=%s: %v", where, value, err)
				continue
			}
			for _, line := range lines {
				n, v, ok := strings.Cut(strings.TrimPrefix(line, "--"), "=")
				if !strings.HasPrefix(line, "--") || !ok {
					c.errorf(o, "%sflagfile %s: line %q is not --flag=value", where, value, line)
					continue
				}
				uses = append(uses, flagUse{n, v, "flagfile " + value})
			}
		}
	}
	if c.skipBins[bin] {
		return
	}
	flags, ok := c.bins[bin]
	if !ok {
		c.errorf(o, "%scommand %s: the check was not given this binary (--bin %s=PATH)", where, bin, bin)
		return
	}
	seen := map[string]string{}
	for _, u := range uses {
		if prev, dup := seen[u.name]; dup {
			c.errorf(o, "%s--%s given twice (%s and %s)", where, u.name, prev, u.origin)
		}
		seen[u.name] = u.origin
		if abslBuiltinFlags[u.name] {
			continue
		}
		f, known := flags[u.name]
		if !known {
			key := bin + ":" + u.name
			if c.pending[key] {
				c.usedPend[key] = true
				c.notes = append(c.notes, fmt.Sprintf("PENDING: %s --%s is not in `%s --help` yet; allowed by --pending-flag %s", o.id(), u.name, bin, key))
				continue
			}
			c.errorf(o, "%sunknown flag --%s for %s (%s); `%s --help` does not list it", where, u.name, bin, u.origin, bin)
			continue
		}
		if strings.Contains(u.value, "$(") {
			continue // expanded by the kubelet
		}
		if msg := checkValue(f, u.value); msg != "" {
			c.errorf(o, "%s--%s (%s) %s", where, u.name, u.origin, msg)
		}
		if strings.HasSuffix(u.name, "_address") || strings.HasSuffix(u.name, "_workers") {
			c.checkAddresses(o, ct, where, u)
		}
		if bin == "pd-tierd" && u.name == "dram_mib" {
			c.checkDramFits(o, ct, where, u.value)
		}
	}
	for key := range c.pending {
		if strings.HasPrefix(key, bin+":") {
			if _, ok := flags[strings.TrimPrefix(key, bin+":")]; ok {
				c.errorf(o, "--pending-flag %s: %s --help lists it now; drop the pending entry", key, bin)
			}
		}
	}
}

func (c *checker) resolveFlagfile(file string, mounts map[string]string, volumes map[string]map[string]interface{}) ([]string, error) {
	dir, key := path.Split(file)
	vn, ok := mounts[strings.TrimSuffix(dir, "/")]
	if !ok {
		return nil, fmt.Errorf("no volume is mounted at %s", dir)
	}
	cmName := s(get(volumes[vn], "configMap", "name"))
	if cmName == "" {
		return nil, fmt.Errorf("volume %s mounted at %s is not a ConfigMap", vn, dir)
	}
	cm := c.byID["ConfigMap/"+cmName]
	if cm == nil {
		return nil, fmt.Errorf("ConfigMap %q does not exist", cmName)
	}
	data, ok := m(cm.body["data"])[key]
	if !ok {
		return nil, fmt.Errorf("ConfigMap %s has no key %q", cmName, key)
	}
	var lines []string
	for _, line := range strings.Split(s(data), "\n") {
		line = strings.TrimSpace(line)
		if line != "" && !strings.HasPrefix(line, "#") {
			lines = append(lines, line)
		}
	}
	return lines, nil
}

// checkAddresses: listen addresses match a declared containerPort; addresses of other
// components name a Service of the release (or a StatefulSet pod behind its headless Service)
// and one of its ports.
func (c *checker) checkAddresses(o *object, ct map[string]interface{}, where string, u flagUse) {
	if u.value == "" {
		return
	}
	for _, addr := range strings.Split(u.value, ",") {
		i := strings.LastIndex(addr, ":")
		if i < 0 {
			c.errorf(o, "%s--%s: %q is not host:port", where, u.name, addr)
			continue
		}
		host, portText := addr[:i], addr[i+1:]
		port, err := strconv.Atoi(portText)
		if err != nil || port < 1 || port > 65535 {
			c.errorf(o, "%s--%s: port %q of %q is not in 1..65535", where, u.name, portText, addr)
			continue
		}
		switch {
		case host == "0.0.0.0" || host == "[::]":
			if !containerHasPort(ct, float64(port)) {
				c.errorf(o, "%s--%s listens on port %d, which is not a containerPort", where, u.name, port)
			}
		case host == "127.0.0.1" || host == "localhost":
			if u.name == "grpc_address" || u.name == "metrics_address" {
				c.errorf(o, "%s--%s=%s listens on loopback: probes and peers cannot reach it", where, u.name, addr)
			}
		default:
			c.checkServiceAddress(o, where, u.name, host, port)
		}
	}
}

func (c *checker) checkServiceAddress(o *object, where, flag, host string, port int) {
	labels := strings.Split(strings.TrimSuffix(host, ".svc.cluster.local"), ".")
	if len(labels) >= 3 && labels[len(labels)-1] == "svc" {
		labels = labels[:len(labels)-1]
	}
	svcPorts := func(svc *object) []int {
		var out []int
		for _, p := range l(get(svc.body, "spec", "ports")) {
			if n, ok := isInt(get(p, "port")); ok {
				out = append(out, n)
			}
		}
		return out
	}
	hasPort := func(svc *object) bool {
		for _, p := range svcPorts(svc) {
			if p == port {
				return true
			}
		}
		return false
	}
	if svc := c.byID["Service/"+labels[0]]; svc != nil {
		if !hasPort(svc) {
			c.errorf(o, "%s--%s: Service %s has no port %d (ports %v)", where, flag, labels[0], port, svcPorts(svc))
		}
		return
	}
	if len(labels) >= 2 {
		if svc := c.byID["Service/"+labels[1]]; svc != nil {
			c.checkPodAddress(o, where, flag, labels[0], svc, port)
			return
		}
	}
	if len(labels) == 1 {
		c.errorf(o, "%s--%s: %q is not a Service of this release", where, flag, host)
		return
	}
	c.notes = append(c.notes, fmt.Sprintf("%s --%s: %s:%d is outside the release (not checked)", o.id(), flag, host, port))
}

// checkPodAddress: <pod>.<headless service>: the pod is an ordinal of a StatefulSet governed
// by that Service and listens on the port.
func (c *checker) checkPodAddress(o *object, where, flag, podName string, svc *object, port int) {
	if s(get(svc.body, "spec", "clusterIP")) != "None" {
		c.errorf(o, "%s--%s: %s.%s needs Service %s to be headless (clusterIP: None)", where, flag, podName, svc.name, svc.name)
	}
	for _, sts := range c.objects {
		if sts.kind != "StatefulSet" || s(get(sts.body, "spec", "serviceName")) != svc.name {
			continue
		}
		if !strings.HasPrefix(podName, sts.name+"-") {
			continue
		}
		ord, err := strconv.Atoi(strings.TrimPrefix(podName, sts.name+"-"))
		replicas, _ := isInt(get(sts.body, "spec", "replicas"))
		if err != nil || ord < 0 || ord >= replicas {
			c.errorf(o, "%s--%s: pod %s does not exist (StatefulSet %s has %d replicas)", where, flag, podName, sts.name, replicas)
			return
		}
		if !podHasPort(m(get(sts.body, "spec", "template", "spec")), float64(port)) {
			c.errorf(o, "%s--%s: pods of StatefulSet %s have no containerPort %d", where, flag, sts.name, port)
		}
		return
	}
	c.errorf(o, "%s--%s: no StatefulSet with serviceName %s has a pod %q", where, flag, svc.name, podName)
}

// --- other kinds ---

func (c *checker) checkService(o *object) {
	sel := stringMap(get(o.body, "spec", "selector"))
	if len(sel) == 0 {
		c.errorf(o, "spec.selector is empty (the chart never makes selector-less Services)")
		return
	}
	pods := c.podsSelectedBy(sel)
	if len(pods) == 0 {
		c.errorf(o, "spec.selector %v selects no pod template of the release", sel)
	}
	ports := l(get(o.body, "spec", "ports"))
	if len(ports) == 0 {
		c.errorf(o, "no ports")
	}
	names := map[string]bool{}
	for _, p := range ports {
		pn := s(get(p, "name"))
		if len(ports) > 1 && pn == "" {
			c.errorf(o, "a Service with several ports must name each")
		}
		if names[pn] {
			c.errorf(o, "port name %q twice", pn)
		}
		names[pn] = true
		if _, ok := isInt(get(p, "port")); !ok {
			c.errorf(o, "port %s has no numeric port", pn)
		}
		target := get(p, "targetPort")
		if target == nil {
			target = get(p, "port")
		}
		for _, pd := range pods {
			if !podHasPort(pd.spec, target) {
				c.errorf(o, "port %s: targetPort %v is not a port of %s's pods", pn, target, pd.owner.id())
			}
		}
	}
}

func (c *checker) checkPDB(o *object) {
	spec := m(o.body["spec"])
	_, hasMin := spec["minAvailable"]
	_, hasMax := spec["maxUnavailable"]
	if hasMin == hasMax {
		c.errorf(o, "set exactly one of minAvailable and maxUnavailable")
	}
	pods := c.podsSelectedBy(stringMap(get(spec, "selector", "matchLabels")))
	if len(pods) == 0 {
		c.errorf(o, "selector selects no pod template of the release")
	}
	if n, ok := isInt(spec["minAvailable"]); ok {
		for _, p := range pods {
			if r, ok := isInt(get(p.owner.body, "spec", "replicas")); ok && n >= r {
				c.errorf(o, "minAvailable %d >= %s replicas %d: no pod could ever be evicted", n, p.owner.id(), r)
			}
		}
	}
}

func (c *checker) checkHPA(o *object) {
	ref := m(get(o.body, "spec", "scaleTargetRef"))
	target := c.byID[s(ref["kind"])+"/"+s(ref["name"])]
	if target == nil {
		c.errorf(o, "scaleTargetRef %s/%s does not exist", s(ref["kind"]), s(ref["name"]))
	} else if _, set := m(target.body["spec"])["replicas"]; set {
		c.errorf(o, "%s sets spec.replicas: every upgrade would reset what the HPA chose", target.id())
	}
	lo, ok1 := isInt(get(o.body, "spec", "minReplicas"))
	hi, ok2 := isInt(get(o.body, "spec", "maxReplicas"))
	if !ok1 || !ok2 || lo < 1 || lo > hi {
		c.errorf(o, "need 1 <= minReplicas <= maxReplicas, got %v..%v", get(o.body, "spec", "minReplicas"), get(o.body, "spec", "maxReplicas"))
	}
}

func (c *checker) checkServiceMonitor(o *object) {
	sel := stringMap(get(o.body, "spec", "selector", "matchLabels"))
	var svcs []*object
	for _, x := range c.objects {
		if x.kind == "Service" && selects(sel, stringMap(get(x.body, "metadata", "labels"))) {
			svcs = append(svcs, x)
		}
	}
	if len(svcs) == 0 {
		c.errorf(o, "selector %v matches no Service", sel)
	}
	for _, ep := range l(get(o.body, "spec", "endpoints")) {
		pn := s(get(ep, "port"))
		for _, svc := range svcs {
			found := false
			for _, p := range l(get(svc.body, "spec", "ports")) {
				if s(get(p, "name")) == pn {
					found = true
				}
			}
			if !found {
				c.errorf(o, "endpoint port %q is not a named port of %s", pn, svc.id())
			}
		}
	}
}

func (c *checker) checkNetworkPolicy(o *object) {
	targets := c.podsSelectedBy(stringMap(get(o.body, "spec", "podSelector", "matchLabels")))
	if len(targets) == 0 {
		c.errorf(o, "podSelector selects no pod template of the release")
	}
	// A podSelector {} is every pod of the namespace; otherwise it must select pods of the
	// release. Named ports and single numbers must be ports of the pods they lead to; a range
	// (endPort) holds ports the pods bind at run time.
	checkPeers := func(dir string, i int, peers []interface{}) []pod {
		var selected []pod
		for _, peer := range peers {
			pm := m(peer)
			if pm["podSelector"] != nil && pm["namespaceSelector"] == nil {
				sel := stringMap(get(pm, "podSelector", "matchLabels"))
				if len(sel) == 0 {
					continue
				}
				ps := c.podsSelectedBy(sel)
				if len(ps) == 0 {
					c.errorf(o, "%s[%d]: podSelector %v selects no pod template of the release", dir, i, sel)
				}
				selected = append(selected, ps...)
			}
		}
		return selected
	}
	checkPorts := func(dir string, i int, rule interface{}, pods []pod) {
		for _, p := range l(get(rule, "ports")) {
			port := get(p, "port")
			if get(p, "endPort") != nil {
				continue
			}
			for _, t := range pods {
				if !podHasPort(t.spec, port) {
					c.errorf(o, "%s[%d]: port %v is not a port of %s's pods", dir, i, port, t.owner.id())
				}
			}
		}
	}
	for i, rule := range l(get(o.body, "spec", "ingress")) {
		checkPeers("ingress", i, l(get(rule, "from")))
		checkPorts("ingress", i, rule, targets)
	}
	for i, rule := range l(get(o.body, "spec", "egress")) {
		pods := checkPeers("egress", i, l(get(rule, "to")))
		// Named ports of egress rules are resolved at the destination pods.
		checkPorts("egress", i, rule, pods)
	}
}

func (c *checker) checkSecret(o *object) {
	for k, v := range m(o.body["data"]) {
		if _, err := base64.StdEncoding.DecodeString(s(v)); err != nil {
			c.errorf(o, "data.%s is not base64", k)
		}
	}
}

func (c *checker) run() {
	for _, o := range c.objects {
		c.checkSchema(o)
		switch o.kind {
		case "Deployment", "StatefulSet", "DaemonSet":
			c.checkWorkload(o)
		case "Service":
			c.checkService(o)
		case "PodDisruptionBudget":
			c.checkPDB(o)
		case "HorizontalPodAutoscaler":
			c.checkHPA(o)
		case "ServiceMonitor":
			c.checkServiceMonitor(o)
		case "NetworkPolicy":
			c.checkNetworkPolicy(o)
		case "Secret":
			c.checkSecret(o)
		case "ConfigMap":
			for k, v := range m(o.body["data"]) {
				if _, ok := v.(string); !ok {
					c.errorf(o, "data.%s is not a string", k)
				}
			}
		}
	}
	c.checkNetworkPolicies()
	if c.expectSecure {
		c.checkSecureMode()
	}
	sort.Strings(c.notes)
}

// checkDramFits: pd-tierd posix_fallocate()s its whole DRAM tier in shared memory at start-up,
// and tmpfs pages are charged to the memory cgroup of the process that allocates them: a memory
// limit below --dram_mib gets tierd OOM-killed (or refused) before it serves anything.
func (c *checker) checkDramFits(o *object, ct map[string]interface{}, where, value string) {
	dram, ok := new(big.Rat).SetString(value)
	if !ok {
		return
	}
	dram.Mul(dram, big.NewRat(1<<20, 1))
	for _, section := range []string{"limits", "requests"} {
		q := s(get(ct, "resources", section, "memory"))
		if q == "" {
			continue
		}
		mem, ok := parseQuantity(q)
		if ok && mem.Cmp(dram) < 0 {
			c.errorf(o, "%sresources.%s.memory %s is below --dram_mib=%s MiB: tierd allocates its DRAM tier in shared memory charged to its own cgroup", where, section, q, value)
		}
	}
}
