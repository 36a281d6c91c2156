"""One API class, several model families: the shared SamPredictor and SamAutomaticMaskGenerator,
given a model of another family, build that family's subclass (its parameters, defaults and steps).

A family's subclass names the model class it serves, `class X(SamPredictor, serves=SAM2Base)`, so
the shared modules never import a family; samfast.sam2 declares its subclasses when it is
imported, which `import samfast` does.
"""

from __future__ import annotations


class ServesFamilies:
    """Base of a shared API class whose constructor takes the model first."""

    _family_classes: dict[type, type]  # model class -> the subclass that serves it

    def __init_subclass__(cls, serves: type | None = None, **kwargs) -> None:
        super().__init_subclass__(**kwargs)
        if serves is None:  # a shared API class (or a plain subclass): its own, empty table
            cls._family_classes = {}
        else:
            cls._family_classes[serves] = cls

    def __new__(cls, model, *args, **kwargs):
        served_by = next((sub for model_class, sub in cls._family_classes.items() if isinstance(model, model_class)), cls)
        # Python then runs served_by.__init__ with the caller's arguments
        return super().__new__(served_by if issubclass(served_by, cls) else cls)
