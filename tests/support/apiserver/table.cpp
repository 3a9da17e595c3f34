// Server-side printing, following what the Kubernetes API server sends:
// custom kinds get a Name column then their additionalPrinterColumns (Age
// alone when none are declared); built-in kinds get the columns of the
// API server's own printers. Date cells carry the age as the server writes
// it ("5m", "3d4h"); absent values are null cells, which kubectl shows as
// <none>.
#include "tests/support/apiserver/table.h"

#include <cctype>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <functional>
#include <vector>

namespace tandem::testing {
namespace {

using nlohmann::json;

// ---------------------------------------------------------------------------
// JSONPath

// Steps of the printer-column subset: a field name, an index, every element,
// or a filter comparing a field of each element with a literal.
struct Step {
  enum class Type { kField, kIndex, kAll, kFilter };
  Type type = Type::kField;
  std::string name;  // kField; kFilter: the element's field path ("a.b")
  long long index = 0;
  std::string op;  // kFilter: "==", "!=", "<", "<=", ">", ">=", or "" (exists)
  json literal;
};

class PathError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

json parseLiteral(const std::string& text) {
  if (text.size() >= 2 && (text.front() == '"' || text.front() == '\'') &&
      text.back() == text.front()) {
    return text.substr(1, text.size() - 2);
  }
  if (text == "true") return true;
  if (text == "false") return false;
  if (text == "null") return nullptr;
  char* end = nullptr;
  double number = std::strtod(text.c_str(), &end);
  if (!text.empty() && end == text.c_str() + text.size()) {
    if (number == static_cast<double>(static_cast<long long>(number)) &&
        text.find_first_of(".eE") == std::string::npos) {
      return static_cast<long long>(number);
    }
    return number;
  }
  // kubectl compares unquoted words as strings.
  return text;
}

Step parseFilter(const std::string& body) {
  // body: @.field.path <op> literal, or @.field.path
  Step step;
  step.type = Step::Type::kFilter;
  std::string text = body;
  size_t op_at = std::string::npos;
  for (const char* op : {"==", "!=", "<=", ">=", "<", ">"}) {
    op_at = text.find(op);
    if (op_at != std::string::npos) {
      step.op = op;
      break;
    }
  }
  auto trim = [](std::string s) {
    size_t begin = s.find_first_not_of(' ');
    size_t end = s.find_last_not_of(' ');
    return begin == std::string::npos ? std::string() : s.substr(begin, end - begin + 1);
  };
  std::string left = trim(step.op.empty() ? text : text.substr(0, op_at));
  if (left.rfind("@.", 0) != 0) {
    throw PathError("a filter must test a field of the element (@.field), got \"" + body + "\"");
  }
  step.name = left.substr(2);
  if (!step.op.empty()) step.literal = parseLiteral(trim(text.substr(op_at + step.op.size())));
  return step;
}

Step allStep() {
  Step step;
  step.type = Step::Type::kAll;
  return step;
}

std::vector<Step> parsePath(const std::string& input) {
  std::string path = input;
  if (path.size() >= 2 && path.front() == '{' && path.back() == '}') {
    path = path.substr(1, path.size() - 2);
  }
  if (!path.empty() && path[0] == '$') path = path.substr(1);
  std::vector<Step> steps;
  size_t i = 0;
  while (i < path.size()) {
    char c = path[i];
    if (c == '.') {
      ++i;
      size_t end = i;
      while (end < path.size() && path[end] != '.' && path[end] != '[') ++end;
      std::string name = path.substr(i, end - i);
      if (name == "*") {
        steps.push_back(allStep());
      } else if (!name.empty()) {
        Step step;
        step.name = name;
        steps.push_back(step);
      }
      i = end;
    } else if (c == '[') {
      size_t close;
      if (i + 1 < path.size() && (path[i + 1] == '\'' || path[i + 1] == '"')) {
        char quote = path[i + 1];
        size_t end_quote = path.find(quote, i + 2);
        if (end_quote == std::string::npos || end_quote + 1 >= path.size() ||
            path[end_quote + 1] != ']') {
          throw PathError("unterminated quoted key in \"" + input + "\"");
        }
        Step step;
        step.name = path.substr(i + 2, end_quote - i - 2);
        steps.push_back(step);
        i = end_quote + 2;
        continue;
      }
      if (path.compare(i, 3, "[?(") == 0) {
        close = path.find(")]", i);
        if (close == std::string::npos) throw PathError("unterminated filter in \"" + input + "\"");
        steps.push_back(parseFilter(path.substr(i + 3, close - i - 3)));
        i = close + 2;
        continue;
      }
      close = path.find(']', i);
      if (close == std::string::npos) throw PathError("unterminated [ in \"" + input + "\"");
      std::string inside = path.substr(i + 1, close - i - 1);
      if (inside == "*") {
        steps.push_back(allStep());
      } else {
        Step step;
        step.type = Step::Type::kIndex;
        char* end = nullptr;
        step.index = std::strtoll(inside.c_str(), &end, 10);
        if (inside.empty() || end != inside.c_str() + inside.size()) {
          throw PathError("\"[" + inside + "]\" is not an index, * or filter in \"" + input + "\"");
        }
        steps.push_back(step);
      }
      i = close + 1;
    } else {
      // A leading name without a dot ("spec.replicas").
      size_t end = i;
      while (end < path.size() && path[end] != '.' && path[end] != '[') ++end;
      Step step;
      step.name = path.substr(i, end - i);
      steps.push_back(step);
      i = end;
    }
  }
  return steps;
}

const json* fieldPath(const json& element, const std::string& dotted) {
  const json* current = &element;
  size_t start = 0;
  while (start <= dotted.size()) {
    size_t dot = dotted.find('.', start);
    std::string name =
        dotted.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
    if (!current->is_object()) return nullptr;
    auto it = current->find(name);
    if (it == current->end()) return nullptr;
    current = &*it;
    if (dot == std::string::npos) break;
    start = dot + 1;
  }
  return current;
}

bool compare(const json& value, const std::string& op, const json& literal) {
  json left = value;
  json right = literal;
  // Unquoted literals compare as strings with strings, numbers with numbers.
  if (left.is_string() && right.is_number()) right = right.dump();
  if (left.is_number() && right.is_string()) return op == "!=";
  if (left.is_boolean() && right.is_string()) right = right == "true";
  if (op == "==") return left == right;
  if (op == "!=") return left != right;
  bool ordered = (left.is_number() && right.is_number()) || (left.is_string() && right.is_string());
  if (!ordered) return false;
  if (op == "<") return left < right;
  if (op == "<=") return left <= right;
  if (op == ">") return left > right;
  return left >= right;
}

void evaluate(const json& value, const std::vector<Step>& steps, size_t at,
              std::vector<const json*>& out) {
  if (at == steps.size()) {
    out.push_back(&value);
    return;
  }
  const Step& step = steps[at];
  switch (step.type) {
    case Step::Type::kField: {
      if (!value.is_object()) return;
      auto it = value.find(step.name);
      if (it != value.end()) evaluate(*it, steps, at + 1, out);
      return;
    }
    case Step::Type::kIndex: {
      if (!value.is_array()) return;
      long long index =
          step.index < 0 ? static_cast<long long>(value.size()) + step.index : step.index;
      if (index >= 0 && index < static_cast<long long>(value.size())) {
        evaluate(value[static_cast<size_t>(index)], steps, at + 1, out);
      }
      return;
    }
    case Step::Type::kAll:
      if (value.is_array() || value.is_object()) {
        for (const auto& element : value) evaluate(element, steps, at + 1, out);
      }
      return;
    case Step::Type::kFilter:
      if (!value.is_array()) return;
      for (const auto& element : value) {
        const json* tested = fieldPath(element, step.name);
        if (tested == nullptr) continue;
        if (step.op.empty() || compare(*tested, step.op, step.literal)) {
          evaluate(element, steps, at + 1, out);
        }
      }
      return;
  }
}

// ---------------------------------------------------------------------------
// Cells

std::optional<int64_t> parseTimestamp(const std::string& text) {
  std::tm tm{};
  int year, month, day, hour, minute, second;
  if (std::sscanf(text.c_str(), "%4d-%2d-%2dT%2d:%2d:%2d", &year, &month, &day, &hour, &minute,
                  &second) != 6) {
    return std::nullopt;
  }
  tm.tm_year = year - 1900;
  tm.tm_mon = month - 1;
  tm.tm_mday = day;
  tm.tm_hour = hour;
  tm.tm_min = minute;
  tm.tm_sec = second;
  return static_cast<int64_t>(timegm(&tm));
}

json ageCell(const json& timestamp) {
  if (!timestamp.is_string()) return "<unknown>";
  auto seconds = parseTimestamp(timestamp.get<std::string>());
  if (!seconds) return "<invalid>";
  int64_t now = std::chrono::duration_cast<std::chrono::seconds>(
                    std::chrono::system_clock::now().time_since_epoch())
                    .count();
  return humanDuration(now - *seconds);
}

std::string printed(const json& value) {
  return value.is_string() ? value.get<std::string>() : value.dump();
}

// A custom column's cell from its value, as the API server converts it.
json typedCell(const std::string& type, const json& value) {
  if (type == "string") return printed(value);
  if (type == "integer") {
    if (value.is_number()) return value.get<int64_t>();
    return nullptr;
  }
  if (type == "number") {
    if (value.is_number()) return value.get<double>();
    return nullptr;
  }
  if (type == "boolean") return value.is_boolean() ? value : json();
  if (type == "date") return value.is_string() ? ageCell(value) : json();
  return nullptr;
}

json column(const std::string& name, const std::string& type, const std::string& description,
            int priority = 0, const std::string& format = "") {
  return {{"name", name},
          {"type", type},
          {"format", format},
          {"description", description},
          {"priority", priority}};
}

json nameColumn() {
  return column("Name", "string", "Name must be unique within a namespace. Cannot be updated.", 0,
                "name");
}

json ageColumn() {
  return column("Age", "string",
                "CreationTimestamp is a timestamp representing the server time when this object "
                "was created.");
}

int64_t integerAt(const json& object, const std::string& path) {
  auto value = evalJsonPath(object, path);
  return value && value->is_number() ? value->get<int64_t>() : 0;
}

std::string stringAt(const json& object, const std::string& path,
                     const std::string& fallback = "<none>") {
  auto value = evalJsonPath(object, path);
  if (!value || value->is_null()) return fallback;
  std::string text = printed(*value);
  return text.empty() ? fallback : text;
}

std::string joined(const std::vector<std::string>& parts, const std::string& separator = ",") {
  std::string out;
  for (const auto& part : parts) out += (out.empty() ? "" : separator) + part;
  return out;
}

// Columns and a row function for one built-in kind.
struct BuiltinPrinter {
  json columns;
  std::function<json(const json&)> cells;
};

BuiltinPrinter builtinPrinter(const std::string& kind) {
  auto name = [](const json& o) { return o["metadata"].value("name", ""); };
  auto age = [](const json& o) {
    return ageCell(o["metadata"].value("creationTimestamp", json()));
  };
  if (kind == "Deployment") {
    return {
        json::array({nameColumn(), column("Ready", "string", "Number of the pod with ready state"),
                     column("Up-to-date", "string",
                            "Total number of non-terminated pods targeted by this deployment "
                            "that have the desired template spec."),
                     column("Available", "string",
                            "Total number of available pods (ready for at least "
                            "minReadySeconds) targeted by this deployment."),
                     ageColumn(),
                     column("Containers", "string", "Names of each container in the template.", 1),
                     column("Images", "string",
                            "Images referenced by each container in the "
                            "template.",
                            1),
                     column("Selector", "string", "Label selector for pods.", 1)}),
        [=](const json& o) {
          int64_t desired = o.contains("spec") && o["spec"].contains("replicas")
                                ? integerAt(o, ".spec.replicas")
                                : 1;
          std::vector<std::string> names, images, selector;
          if (auto containers = evalJsonPath(o, ".spec.template.spec.containers");
              containers && containers->is_array()) {
            for (const auto& c : *containers) {
              names.push_back(c.value("name", ""));
              images.push_back(c.value("image", ""));
            }
          }
          if (auto labels = evalJsonPath(o, ".spec.selector.matchLabels");
              labels && labels->is_object()) {
            for (const auto& [k, v] : labels->items()) selector.push_back(k + "=" + printed(v));
          }
          return json::array({name(o),
                              std::to_string(integerAt(o, ".status.readyReplicas")) + "/" +
                                  std::to_string(desired),
                              integerAt(o, ".status.updatedReplicas"),
                              integerAt(o, ".status.availableReplicas"), age(o), joined(names),
                              joined(images), selector.empty() ? "<none>" : joined(selector)});
        }};
  }
  if (kind == "Service") {
    return {json::array({nameColumn(), column("Type", "string", "The type of the service."),
                         column("Cluster-IP", "string", "The cluster IP of the service."),
                         column("External-IP", "string", "The external IPs of the service."),
                         column("Port(s)", "string", "The ports of the service."), ageColumn(),
                         column("Selector", "string", "The selector of the service.", 1)}),
            [=](const json& o) {
              std::string type = stringAt(o, ".spec.type", "ClusterIP");
              std::vector<std::string> external;
              if (auto ips = evalJsonPath(o, ".spec.externalIPs"); ips && ips->is_array()) {
                for (const auto& ip : *ips) external.push_back(printed(ip));
              }
              if (type == "LoadBalancer") {
                if (auto ingress = evalJsonPath(o, ".status.loadBalancer.ingress");
                    ingress && ingress->is_array()) {
                  for (const auto& entry : *ingress) {
                    external.push_back(entry.value("ip", entry.value("hostname", "")));
                  }
                }
                if (external.empty()) external.push_back("<pending>");
              } else if (type == "ExternalName") {
                external = {stringAt(o, ".spec.externalName")};
              }
              std::vector<std::string> ports;
              if (auto list = evalJsonPath(o, ".spec.ports"); list && list->is_array()) {
                for (const auto& port : *list) {
                  std::string text = std::to_string(port.value("port", 0));
                  if (port.contains("nodePort")) {
                    text += ":" + std::to_string(port.value("nodePort", 0));
                  }
                  ports.push_back(text + "/" + port.value("protocol", "TCP"));
                }
              }
              std::vector<std::string> selector;
              if (auto labels = evalJsonPath(o, ".spec.selector"); labels && labels->is_object()) {
                for (const auto& [k, v] : labels->items()) selector.push_back(k + "=" + printed(v));
              }
              return json::array({name(o), type, stringAt(o, ".spec.clusterIP"),
                                  external.empty() ? "<none>" : joined(external),
                                  ports.empty() ? "<none>" : joined(ports), age(o),
                                  selector.empty() ? "<none>" : joined(selector)});
            }};
  }
  if (kind == "Pod") {
    return {
        json::array({nameColumn(),
                     column("Ready", "string",
                            "The aggregate readiness state of this pod for accepting "
                            "traffic."),
                     column("Status", "string",
                            "The aggregate status of the containers in "
                            "this pod."),
                     column("Restarts", "string",
                            "The number of times the containers in "
                            "this pod have been restarted."),
                     ageColumn(), column("IP", "string", "The IP address assigned to the pod", 1),
                     column("Node", "string",
                            "The name of the node to which the pod is "
                            "assigned",
                            1)}),
        [=](const json& o) {
          int64_t total = 0, ready = 0, restarts = 0;
          if (auto spec = evalJsonPath(o, ".spec.containers"); spec && spec->is_array()) {
            total = static_cast<int64_t>(spec->size());
          }
          if (auto statuses = evalJsonPath(o, ".status.containerStatuses");
              statuses && statuses->is_array()) {
            for (const auto& s : *statuses) {
              if (s.value("ready", false)) ++ready;
              restarts += s.value("restartCount", 0);
            }
          }
          std::string status = stringAt(o, ".status.reason", "");
          if (status.empty()) status = stringAt(o, ".status.phase", "Pending");
          if (o["metadata"].contains("deletionTimestamp")) status = "Terminating";
          return json::array({name(o), std::to_string(ready) + "/" + std::to_string(total), status,
                              std::to_string(restarts), age(o), stringAt(o, ".status.podIP"),
                              stringAt(o, ".spec.nodeName")});
        }};
  }
  if (kind == "Event") {
    // kubectl get events: LAST SEEN, TYPE, REASON, OBJECT, MESSAGE.
    return {json::array({column("Last Seen", "string", "Time of the last occurrence."),
                         column("Type", "string", "Normal or Warning."),
                         column("Reason", "string", "Why the event was recorded."),
                         column("Object", "string", "The object the event is about."),
                         column("Message", "string", "What happened.")}),
            [=](const json& o) {
              json last = o.value("lastTimestamp", json());
              if (last.is_null()) last = o.value("eventTime", json());
              if (last.is_null()) last = o["metadata"].value("creationTimestamp", json());
              std::string object = stringAt(o, ".involvedObject.kind", "");
              for (char& c : object)
                c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
              object += "/" + stringAt(o, ".involvedObject.name", "");
              return json::array({ageCell(last), stringAt(o, ".type", ""),
                                  stringAt(o, ".reason", ""), object, stringAt(o, ".message", "")});
            }};
  }
  if (kind == "Lease") {
    return {json::array({nameColumn(), column("Holder", "string", "The holder of the lease."),
                         ageColumn()}),
            [=](const json& o) {
              return json::array({name(o), stringAt(o, ".spec.holderIdentity", ""), age(o)});
            }};
  }
  if (kind == "EndpointSlice") {
    return {
        json::array(
            {nameColumn(), column("AddressType", "string", "The IP protocol for this slice."),
             column("Ports", "string", "The ports contained in this slice."),
             column("Endpoints", "string", "The endpoints contained in this slice."), ageColumn()}),
        [=](const json& o) {
          std::vector<std::string> ports, addresses;
          if (auto list = o.find("ports"); list != o.end() && list->is_array()) {
            for (const auto& port : *list) {
              if (port.contains("port")) ports.push_back(printed(port["port"]));
            }
          }
          int64_t total = 0;
          if (auto list = o.find("endpoints"); list != o.end() && list->is_array()) {
            for (const auto& endpoint : *list) {
              for (const auto& address : endpoint.value("addresses", json::array())) {
                ++total;
                if (addresses.size() < 3) addresses.push_back(printed(address));
              }
            }
          }
          std::string endpoints = addresses.empty() ? "<unset>" : joined(addresses);
          if (total > 3) endpoints += " + " + std::to_string(total - 3) + " more...";
          return json::array({name(o), o.value("addressType", ""),
                              ports.empty() ? "<unset>" : joined(ports), endpoints, age(o)});
        }};
  }
  if (kind == "Namespace") {
    return {json::array({nameColumn(), column("Status", "string", "The status of the namespace"),
                         ageColumn()}),
            [=](const json& o) {
              return json::array({name(o), stringAt(o, ".status.phase", "Active"), age(o)});
            }};
  }
  if (kind == "ConfigMap" || kind == "Secret") {
    bool secret = kind == "Secret";
    json columns = json::array({nameColumn()});
    if (secret) columns.push_back(column("Type", "string", "The type of the secret"));
    columns.push_back(column("Data", "string", "The number of entries in the data"));
    columns.push_back(ageColumn());
    return {columns, [=](const json& o) {
              size_t entries = 0;
              for (const char* field : {"data", "binaryData", "stringData"}) {
                if (o.contains(field) && o[field].is_object()) entries += o[field].size();
              }
              json row = json::array({name(o)});
              if (secret) row.push_back(o.value("type", "Opaque"));
              row.push_back(static_cast<int64_t>(entries));
              row.push_back(age(o));
              return row;
            }};
  }
  if (kind == "CustomResourceDefinition") {
    return {json::array({nameColumn(),
                         column("Created At", "date",
                                "CreationTimestamp is a timestamp "
                                "representing the server time when this object was created.")}),
            [=](const json& o) {
              return json::array({name(o), o["metadata"].value("creationTimestamp", json())});
            }};
  }
  return {json::array({nameColumn(), ageColumn()}), [=](const json& o) {
            return json::array({name(o), age(o)});
          }};
}

json rowObject(const json& object, const std::string& include_object) {
  if (include_object == "None") return nullptr;
  if (include_object == "Object") return object;
  return {{"kind", "PartialObjectMetadata"},
          {"apiVersion", "meta.k8s.io/v1"},
          {"metadata", object.value("metadata", json::object())}};
}

}  // namespace

std::string humanDuration(int64_t seconds) {
  if (seconds < -1) return "<invalid>";
  if (seconds < 0) return "0s";
  if (seconds < 120) return std::to_string(seconds) + "s";
  int64_t minutes = seconds / 60;
  if (minutes < 10) {
    int64_t rest = seconds % 60;
    return std::to_string(minutes) + "m" + (rest == 0 ? "" : std::to_string(rest) + "s");
  }
  if (minutes < 180) return std::to_string(minutes) + "m";
  int64_t hours = seconds / 3600;
  if (hours < 8) {
    int64_t rest = minutes % 60;
    return std::to_string(hours) + "h" + (rest == 0 ? "" : std::to_string(rest) + "m");
  }
  if (hours < 48) return std::to_string(hours) + "h";
  if (hours < 24 * 8) {
    int64_t rest = hours % 24;
    return std::to_string(hours / 24) + "d" + (rest == 0 ? "" : std::to_string(rest) + "h");
  }
  if (hours < 24 * 365 * 2) return std::to_string(hours / 24) + "d";
  if (hours < 24 * 365 * 8) {
    int64_t rest = (hours / 24) % 365;
    return std::to_string(hours / 24 / 365) + "y" + (rest == 0 ? "" : std::to_string(rest) + "d");
  }
  return std::to_string(hours / 24 / 365) + "y";
}

std::optional<json> evalJsonPath(const json& object, const std::string& path) {
  std::vector<Step> steps;
  try {
    steps = parsePath(path);
  } catch (const PathError&) {
    return std::nullopt;
  }
  std::vector<const json*> results;
  evaluate(object, steps, 0, results);
  if (results.empty()) return std::nullopt;
  return *results.front();
}

json toTable(const json& object_or_list, const KindInfo& kind, const std::string& include_object) {
  bool is_list = object_or_list.contains("items") && object_or_list["items"].is_array();
  json columns;
  std::function<json(const json&)> cells;
  if (kind.builtin) {
    BuiltinPrinter printer = builtinPrinter(kind.kind);
    columns = std::move(printer.columns);
    cells = std::move(printer.cells);
  } else {
    json printer_columns = kind.printer_columns;
    if (!printer_columns.is_array() || printer_columns.empty()) {
      printer_columns = json::array(
          {{{"name", "Age"}, {"type", "date"}, {"jsonPath", ".metadata.creationTimestamp"}}});
    }
    columns = json::array({nameColumn()});
    for (const auto& c : printer_columns) {
      columns.push_back(column(c.value("name", ""), c.value("type", "string"),
                               c.value("description", ""), c.value("priority", 0),
                               c.value("format", "")));
    }
    cells = [printer_columns](const json& o) {
      json row = json::array({o["metadata"].value("name", "")});
      for (const auto& c : printer_columns) {
        auto value = evalJsonPath(o, c.value("jsonPath", ""));
        row.push_back(value && !value->is_null() ? typedCell(c.value("type", "string"), *value)
                                                 : json());
      }
      return row;
    };
  }
  json rows = json::array();
  auto add_row = [&](const json& object) {
    json safe = object;
    if (!safe.contains("metadata") || !safe["metadata"].is_object()) {
      safe["metadata"] = json::object();
    }
    rows.push_back({{"cells", cells(safe)}, {"object", rowObject(object, include_object)}});
  };
  if (is_list) {
    for (const auto& item : object_or_list["items"]) add_row(item);
  } else {
    add_row(object_or_list);
  }
  json metadata = json::object();
  const json& source_metadata = object_or_list.value("metadata", json::object());
  for (const char* field : {"resourceVersion", "continue", "remainingItemCount"}) {
    if (source_metadata.contains(field)) metadata[field] = source_metadata[field];
  }
  return {{"kind", "Table"},
          {"apiVersion", "meta.k8s.io/v1"},
          {"metadata", metadata},
          {"columnDefinitions", columns},
          {"rows", rows}};
}

}  // namespace tandem::testing
